import math

import torch

from site_lens.metrics import answer_probability, exact_match, first_token_accuracy, normalize, score, strict_match


def test_normalize_first_line_paren_case():
    assert normalize(" Paris (France)\nmore") == "paris"
    assert normalize(" APPLE\n", case_sensitive=True) == "APPLE"
    assert normalize("(A)") == "(a)" and normalize(" (B) because (x)\n") == "(b) because"
    assert exact_match("(A) blue", "(A)") and not exact_match("(B)", "(A)")
    assert normalize("(n - 1)!") == "(n - 1)!" and normalize("(unclosed") == "(unclosed"


def test_prefix_match_is_lenient_strict_is_not():
    assert exact_match(" ant, small, sofa", "ant")
    assert not strict_match(" ant, small, sofa", "ant")
    assert strict_match(" Ant\n\nQ:", "ant")
    assert not exact_match(" an", "ant")
    assert not exact_match("", "ant")


def test_case_sensitive_tasks_keep_case():
    assert not exact_match(" apple", "Apple", case_sensitive=True)
    assert exact_match(" apple", "Apple", case_sensitive=False)


def test_score_and_first_token_accuracy():
    s = score([" a b", " c", " x"], ["a", "c", "y"])
    assert s == {"exact_match": 2 / 3, "strict_match": 1 / 3}
    logits = torch.tensor([[0.0, 1.0], [2.0, 1.0]])
    assert first_token_accuracy(logits, [1, 1]) == 0.5
    three = torch.tensor([[0.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    assert first_token_accuracy(three, torch.tensor([1, 1, 1])) == 1 / 3  # the count over the rows, exactly
    assert math.isnan(first_token_accuracy(torch.zeros(0, 2), []))


def test_answer_probability_is_the_mean_softmax_of_the_answer():
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(4.0), 0.0]])  # P = (1/4, 3/4) and (4/5, 1/5)
    assert abs(answer_probability(logits, [1, 1]) - (0.75 + 0.2) / 2) < 1e-7
    assert abs(answer_probability(logits, torch.tensor([0, 0])) - (0.25 + 0.8) / 2) < 1e-7


def test_settled_match_agrees_with_every_continuation():
    import itertools
    import random

    from site_lens.metrics import exact_match, settled_match

    rng = random.Random(0)
    alphabet = ["a", "n", "t", " ", "\n", "(", ")", "A", "s", "é"]
    targets = ["ant", "Ant s", "a (b)", "  ant", "n", "(A)", "(a) t", "(n"]
    for _ in range(1000):
        full = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        for target, cs in itertools.product(targets, (False, True)):
            want = exact_match(full, target, cs)
            for cut in range(len(full) + 1):
                got = settled_match(full[:cut], target, cs)
                assert got is None or got == want, (full[:cut], full, target, cs)
    assert settled_match("\ufffd", "ant") is None
    assert (
        settled_match(" An", "ant") is None
        and settled_match(" Ant", "ant") is True
        and settled_match(" b", "ant") is False
    )
