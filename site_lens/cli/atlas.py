"""The `atlas` subcommand: build an atlas from bench folders, show what it holds, compare two, push one."""

from __future__ import annotations

import argparse
import sys

from .args import comma_list, seed_list

EXAMPLES = {
    "build": """examples:
  site-lens atlas build --model smollm2-135m --data data/fv \\
      --from results/smollm2-135m,results/seeds/smollm2-135m --out atlases/smollm2-135m""",
    "show": """examples:
  site-lens atlas show atlases/smollm2-135m                       # tasks, seeds, scores
  site-lens atlas show atlases/smollm2-135m --task antonym        # its top heads and nearest tasks
  site-lens atlas show atlases/smollm2-135m --head 12,3           # the tasks that select L12H3
  site-lens atlas show user/smollm2-135m-site-atlas --revision v1 # from the Hub""",
    "compare": """examples:
  site-lens atlas compare atlases/smollm2-135m atlases/gemma-3-270m   # do the same tasks share heads in both?""",
    "view": """examples:
  site-lens atlas view atlases/smollm2-135m --out atlas.html   # one page, opens offline""",
    "push": """examples:
  site-lens atlas push atlases/smollm2-135m user/smollm2-135m-site-atlas""",
}


def add_atlas_parsers(p: argparse.ArgumentParser, verbose: argparse.ArgumentParser) -> None:
    """The `atlas` subcommand's actions: build, show, compare, push."""
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION", help="build, show, view, compare or push")

    def add(name: str, func, help: str) -> argparse.ArgumentParser:
        q = sub.add_parser(name, parents=[verbose], help=help, description=help, epilog=EXAMPLES[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        q.set_defaults(func=func)
        return q

    q = add("build", cmd_atlas_build, "an atlas from finished bench folders (their SITE thetas and scores; t as bench kept it, else recomputed)")
    q.add_argument("--model", default="smollm2-135m", help="the model the bench folders ran (default: smollm2-135m)")
    q.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
    q.add_argument("--from", dest="folders", type=comma_list, required=True, help="comma list of bench folders")
    q.add_argument("--data", default=None, help="the task folders the bench ran on (default: the built-in tasks)")
    q.add_argument("--tasks", type=comma_list, default=None, help="comma list (default: every task with a SITE theta)")
    q.add_argument("--seeds", type=seed_list, default=None, help="comma list (default: every seed with a SITE theta)")
    q.add_argument("--out", required=True, help="the atlas folder to write")

    q = add("show", cmd_atlas_show, "what an atlas holds; a task's top heads and nearest tasks; a head's tasks")
    q.add_argument("atlas", help="an atlas folder or a Hub id (user/repo)")
    q.add_argument("--revision", default=None, help="a branch, tag or commit of a Hub atlas")
    q.add_argument("--task", default=None, help="show this task's top heads and nearest tasks")
    q.add_argument("--head", default=None, help="LAYER,HEAD: show the tasks that select this head")
    q.add_argument("--k", type=int, default=None, help="top-k (default: a tenth of the heads; 10 for --task)")

    q = add("compare", cmd_atlas_compare, "do the tasks that share heads in one atlas share them in the other (Mantel test)")
    q.add_argument("a", help="an atlas folder or Hub id")
    q.add_argument("b", help="another")
    q.add_argument("--perms", type=int, default=10_000, help="task shuffles of the null (default: 10000)")

    q = add("view", cmd_atlas_view, "one self-contained HTML page that browses an atlas offline")
    q.add_argument("atlas", help="an atlas folder or Hub id")
    q.add_argument("--revision", default=None, help="a branch, tag or commit of a Hub atlas")
    q.add_argument("--out", required=True, help="the HTML file to write")

    q = add("push", cmd_atlas_push, "upload an atlas folder to a Hugging Face Hub model repository")
    q.add_argument("atlas", help="the atlas folder")
    q.add_argument("repo", help="user/repo on the Hub (created if absent)")
    q.add_argument("--private", action="store_true")


def cmd_atlas_build(args: argparse.Namespace) -> None:
    from ..atlas import assemble_atlas
    from ..models import load_model

    model = load_model(args.model, device=args.device)
    command = " ".join(["site-lens", *sys.argv[1:]]) if sys.argv[1:2] == ["atlas"] else None
    atlas = assemble_atlas(model, args.folders, args.data, args.tasks, args.seeds, command=command,
                           progress=lambda line: print(line, flush=True))  # fmt: skip
    path = atlas.save(args.out)
    print(f"{path}: {len(atlas.tasks)} tasks x seeds {atlas.seeds} of {atlas.model['name']}")


def cmd_atlas_show(args: argparse.Namespace) -> None:
    from ..atlas import load_atlas

    atlas = load_atlas(args.atlas, args.revision)
    m = atlas.model
    print(f"{m['name']}: {len(atlas.tasks)} tasks, seeds {atlas.seeds}, {m['n_layers']} layers x {m['n_heads']} heads")
    if args.task:
        print(f"\n{args.task}: top heads by alpha (mean over seeds; in_top_k: seeds that rank it in their top k)")
        print(atlas.top_heads(args.task, k=args.k or 10).round(3).to_string(index=False))
        print(f"\ntasks nearest {args.task} (top-{atlas.default_k()} Jaccard, mean over seeds)")
        print(atlas.nearest(args.task).round(3).to_string(index=False))
    if args.head:
        from ..config import ConfigError

        try:
            layer, head = (int(x) for x in args.head.split(","))
        except ValueError:
            raise ConfigError(f"--head must look like LAYER,HEAD (e.g. 12,3), got '{args.head}'") from None
        k = args.k or atlas.default_k()
        print(f"\ntasks with L{layer}H{head} in their top {k} heads")
        print(atlas.tasks_selecting(layer, head, k=k).round(3).to_string(index=False))
    if not (args.task or args.head):
        s = atlas.scores.groupby("method")[["first_token_acc", "exact_match", "strict_match"]].mean() * 100
        print("\nmean over tasks and seeds, % (exact_match is prefix match):")
        print(s.round(1).to_string())


def cmd_atlas_compare(args: argparse.Namespace) -> None:
    from ..analysis.overlap import format_p
    from ..atlas import compare_atlases, load_atlas

    r = compare_atlases(load_atlas(args.a), load_atlas(args.b), n_perm=args.perms)
    print(f"{r['a']} vs {r['b']}: {r['tasks']} shared tasks, {r['pairs']} pairs")
    print(f"Spearman of the two task-by-task overlap matrices {r['spearman']:+.3f}, p {format_p(r['p_value'], r['n_perm'])} "
          f"(one-sided Mantel, {r['n_perm']:,} task shuffles; null mean {r['null_mean']:+.3f})")  # fmt: skip
    print(f"without the pairs of one task family ({r['pairs_excl']} pairs): {r['spearman_excl']:+.3f}, "
          f"p {format_p(r['p_excl'], r['n_perm'])}")  # fmt: skip


def cmd_atlas_view(args: argparse.Namespace) -> None:
    from ..atlas import load_atlas

    path = load_atlas(args.atlas, args.revision).write_page(args.out)
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")


def cmd_atlas_push(args: argparse.Namespace) -> None:
    from ..atlas import push_to_hub

    print(push_to_hub(args.atlas, args.repo, private=args.private))
