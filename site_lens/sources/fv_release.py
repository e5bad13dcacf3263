"""What the SITE release holds, pinned: the two repositories' commits, each split's item count and
sha256 prefix for the 45 FV tasks, and the licences of the data (facts, checked against the release)."""

from __future__ import annotations

from dataclasses import dataclass

RELEASE_REPO = "SNU-DRL/Soft_Injection"
RELEASE_COMMIT = "01bd5d645bec8df08b781661dfec8b8787f17a5c"
FV_REPO = "ericwtodd/function_vectors"
FV_COMMIT = "fb9eac7b6dc707ea1475a717379916007fe448d5"

# task -> items in train, valid, test, and the first 16 hex digits of each file's sha256, at RELEASE_COMMIT
RELEASE: dict[str, tuple[int, int, int, str, str, str]] = {
    "adjective_v_verb_3": (700, 90, 210, "9fdd86d4477440f3", "060b4543915d06fe", "1e80e0587a63e993"),
    "adjective_v_verb_5": (700, 90, 210, "9ec9b938fc6bd56e", "c3ef33210376d5f0", "56cdb6e040632f44"),
    "ag_news": (5320, 684, 1596, "b36853a3d408b84a", "9c39959434c309f8", "72d73ff0e17b32dc"),
    "alphabetically_first_3": (700, 90, 210, "35268ee20d5f3f27", "69c815d5844dedc1", "7e379dee05258540"),
    "alphabetically_first_5": (700, 90, 210, "830fe834a08d1e23", "5bc78fc9b70ba229", "5763ab114186e48f"),
    "alphabetically_last_3": (700, 90, 210, "43fb62828caf8131", "104dd561b18bf507", "5024145d90ebbdf9"),
    "alphabetically_last_5": (700, 90, 210, "2e9e190c94c87449", "f58e141c8765deb0", "dfd806f09b9e4293"),
    "animal_v_object_3": (700, 90, 210, "103c1c414d3931c2", "e44664523a304d4f", "93fffb79d8605f30"),
    "animal_v_object_5": (700, 90, 210, "0820802281e95ec7", "587375c56f145b16", "2d7dedfcfd447bf9"),
    "antonym": (1678, 216, 504, "7f1fc6ae45ea0c24", "940a874bfe486942", "747fe8bca8549a6e"),
    "capitalize": (569, 74, 170, "aa25923e1e131c7f", "79a758dbdd788ce7", "59eca4948ccb860b"),
    "capitalize_first_letter": (569, 74, 170, "2222d2dea401bad1", "df13d6e634fe3de1", "ee6494c41e64dd9e"),
    "capitalize_second_letter": (550, 72, 165, "5c4940f8ccb1d46c", "80e4c2fcdde46893", "eab4c64bf5eff4d0"),
    "choose_first_of_3": (700, 90, 210, "3040434b0fc0d33d", "169e2646997449a4", "3a7d2ac470169668"),
    "choose_first_of_5": (700, 90, 210, "51bf5644dac713ee", "e0ada7c128a8ad78", "1d83ea6ad1119af2"),
    "choose_last_of_3": (700, 90, 210, "f2e533eaa7ef40eb", "41fa2dd54e9ffb9f", "921741092105ab21"),
    "choose_last_of_5": (700, 90, 210, "688772e5b5c86580", "ac902c8389f0665b", "16e6685136e9cba3"),
    "choose_middle_of_3": (700, 90, 210, "a0f6693acbcd730b", "c9110fc35e307c26", "912a169d4d580758"),
    "color_v_animal_3": (700, 90, 210, "c8d0a89fa241ed8c", "aaf36347af3f018e", "1b77f0e206c1a30a"),
    "color_v_animal_5": (700, 90, 210, "139ff9aa73463ea3", "aef0199315e42359", "2cfed1b2eb155960"),
    "commonsense_qa": (7673, 987, 2302, "6a003abd5c0274b1", "20271a8b4fdeeb20", "11858a246e34839f"),
    "concept_v_object_3": (700, 90, 210, "3ef23da3ddedd2b6", "cb7fe01da00f90fa", "1cdcea6a8e550b83"),
    "concept_v_object_5": (700, 90, 210, "f81375067f6702a2", "ba2c9b13601709da", "4891a00ba2ffe451"),
    "conll2003_location": (3149, 405, 945, "8b2f24e4cc380f23", "9924fda6e0ad0fcd", "bdcf9298fd5c7b6c"),
    "conll2003_person": (2480, 320, 744, "13e072548d15e3ff", "dd72043e6052da5e", "dbf5bfdf9f085fa3"),
    "country-capital": (137, 18, 42, "b7e93242c8c2ac1a", "74997e46a7318466", "cb21d541fd59d02c"),
    "english-french": (3288, 423, 987, "25e5ff70f384d51e", "88de629179d9ad0a", "cc49b056f5a6d2ac"),
    "english-spanish": (3639, 468, 1092, "8ed4cc88650a1931", "3b36dbd1150eb5f6", "30f094a01c5ebfe6"),
    "fruit_v_animal_3": (700, 90, 210, "3a040fe3f63ac7bc", "fbc352712270ed2e", "2fbc59be710e1676"),
    "lowercase_first_letter": (569, 74, 171, "5d7227e2b7aa2a9f", "9bd8525816bbb99d", "36d4932353c2812a"),
    "national_parks": (315, 41, 95, "97cf7121aa043109", "287e444d04c6c08d", "198a426ccb9e5d2e"),
    "next_capital_letter": (569, 74, 171, "3d53c886ce842ee0", "e0cd41a943802dc9", "139fc213e694007f"),
    "object_v_concept_3": (700, 90, 210, "d2fe8d111b42e907", "06dd0a80d427ec64", "123521cf364cf397"),
    "object_v_concept_5": (700, 90, 210, "57cca42a61f84aff", "21923bc79f835c1a", "0d1a82614b67b13b"),
    "park-country": (524, 68, 157, "3f152068cb734912", "0c9c5234b0693786", "cb562901d531cf52"),
    "person-occupation": (574, 75, 172, "ad6f8d1bb782b647", "4ac3fb1808cdf2f1", "3363f72e38bbf816"),
    "person-sport": (222, 29, 67, "4404b8aa6ee6f153", "4dce928d5258a554", "0fae32796509358e"),
    "present-past": (205, 27, 61, "5745062ef051df18", "79900ec6c2afeceb", "b009f6fbbee99671"),
    "prev_item": (157, 21, 47, "1167ae1871f3dd5d", "048a1b2f981fd71c", "27753f6cc0ccee52"),
    "sentiment": (816, 106, 245, "9b6b02b1ba6af925", "63bccfd0fb474a37", "aa34cb62b7881232"),
    "singular-plural": (143, 19, 43, "94b868a6a5698750", "a21533a7d3ebfe2d", "e4fb0d1049b44a3a"),
    "squad_val": (3460, 446, 1038, "100ad38298ded936", "cb9bbd4178296e06", "458957ab80416292"),
    "verb_v_adjective_3": (700, 90, 210, "8a93181e9893811d", "7aa7356bec009e0f", "2e57f130b6a76c61"),
    "verb_v_adjective_5": (700, 90, 210, "0745d5dd17768400", "c9ea26d08b3ef433", "9c676f110b9913c6"),
    "word_length": (569, 74, 171, "013f352b62a1cb09", "a764a6e2f4243c14", "a679a2ad3d2a2fa8"),
}


@dataclass(frozen=True)
class Licence:
    """One licence of the downloaded data: where its text lives and the file it is written to."""

    file: str  # written under the output folder
    spdx: str
    covers: str
    repo: str
    commit: str
    mirror_path: str  # under a mirror (``source``)
    marker: str  # a phrase its text holds

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repo}/blob/{self.commit}/LICENSE"


LICENCES = (
    Licence(
        "LICENSE-soft-injection.txt",
        "Apache-2.0",
        "the train / valid / test splits (the SITE paper's code release, Park et al.)",
        RELEASE_REPO,
        RELEASE_COMMIT,
        "LICENSE",
        "Apache License",
    ),
    Licence(
        "LICENSE-function-vectors.txt",
        "MIT",
        'the task data (Todd et al. 2024, "Function Vectors in Large Language Models")',
        FV_REPO,
        FV_COMMIT,
        "function_vectors/LICENSE",
        "MIT License",
    ),
)
