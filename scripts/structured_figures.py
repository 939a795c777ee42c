"""Draw one picture per grid, video and tree mask for docs/structured.md, with attnlab.viz.plot_mask.

    .venv/bin/python scripts/structured_figures.py            # writes docs/structured/*.png

Each picture is the ``N x N`` matrix of a small example (dark = may attend), its tiles tinted
by the kind ``block_kinds`` gives them (green full, orange partial, white empty: skipped).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnlab import masks
from attnlab.tasks.listops import OPERATORS, VOCAB
from attnlab.viz import plot_mask

ID = {t: i for i, t in enumerate(VOCAB)}
LISTOPS = "<cls> [MAX 2 9 [MIN 4 7 [SM 1 3 ] ] 0 [MED 5 [MAX 8 6 ] 2 ] [MIN 3 [SM 4 4 ] ] 1 ]"


def figures() -> dict[str, tuple[masks.Mask, int, int, str]]:
    """name -> (mask, positions, tile size, title)."""
    tokens = torch.tensor([ID[t] for t in LISTOPS.split()])
    tree = masks.brackets(tokens, opening=[ID[o] for o in OPERATORS], closing=ID["]"])
    return {
        "axial_rows": (masks.axial((6, 8), -1), 48, 8, "axial((6, 8), axis=-1): the row of each cell"),
        "axial_columns": (masks.axial((6, 8), 0), 48, 8, "axial((6, 8), axis=0): the column of each cell"),
        "same_frame": (masks.same_frame((4, 3, 4)), 48, 6, "same_frame((4, 3, 4)): space-only, within the frame"),
        "same_position": (masks.same_position((4, 3, 4)), 48, 6,
                          "same_position((4, 3, 4)): time-only, the same (h, w) in every frame"),
        "block_2d": (masks.block_2d((8, 8), 4), 64, 8, "block_2d((8, 8), size=4): MaxViT's 4 x 4 windows"),
        "grid_2d": (masks.grid_2d((8, 8), 4), 64, 8, "grid_2d((8, 8), size=4): MaxViT's 4 x 4 grid, cells 2 apart"),
        "brackets": (tree, len(tokens), 8, "brackets(ListOps tokens): own bracket pair and the pairs enclosing it"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/structured", help="folder of the pictures")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (mask, n, block, title) in figures().items():
        path = plot_mask(mask, n, block=block, title=title, path=out / f"{name}.png", dpi=100)
        print(path)


if __name__ == "__main__":
    main()
