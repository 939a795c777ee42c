"""How close ``backend="auto"`` comes to the fastest backend, case by case, in a kernels run.

    attnlab bench calibrate                                  # fit auto's cost constants on this machine
    attnlab bench kernels --out bench-kernels --quiet        # the quick kernels suite
    .venv/bin/python scripts/auto_vs_fastest.py bench-kernels/results.json

For every (mask, N, mode) of the kernels suite where ``auto`` ran, it prints auto's time,
the fastest backend's, their ratio as a speed (fastest / auto: 1.00 means auto picked the
winner, or something as fast), the same ratio for the backend auto picked as measured in
its own case ("pick": auto's run and that backend's run are the same kernel timed twice,
so the gap between the two columns is the run's noise) and what auto chose. The last line counts the cases at or
above ``--target`` (default 0.95). Every figure comes from the results file.
"""

from __future__ import annotations

import argparse
import json


def rows(results: dict) -> list[dict]:
    """One row per (mask, N, mode) with ``auto`` and at least one other backend measured."""
    ok = [c for c in results["cases"] if c.get("suite") == "kernels" and c.get("kind") == "backend"
          and c.get("status") == "ok" and c.get("time_s")]
    groups: dict[tuple, dict[str, dict]] = {}
    for c in ok:
        groups.setdefault((c["mask"], c["N"], c["mode"]), {})[c["name"]] = c
    out = []
    for (mask, n, mode), by_name in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        auto = by_name.get("auto")
        others = {k: v for k, v in by_name.items() if k != "auto"}
        if auto is None or not others:
            continue
        best = min(others, key=lambda k: others[k]["time_s"])
        chosen = auto.get("chosen")
        pick = others.get(chosen)
        out.append({"mask": mask, "N": n, "mode": mode, "auto_s": auto["time_s"], "chosen": chosen,
                    "fastest": best, "fastest_s": others[best]["time_s"],
                    "speed": others[best]["time_s"] / auto["time_s"],
                    "pick_speed": others[best]["time_s"] / pick["time_s"] if pick else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results.json of a run that includes the kernels suite")
    ap.add_argument("--target", type=float, default=0.95, help="speed of auto relative to the fastest to count as met")
    args = ap.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    table = rows(results)
    if not table:
        raise SystemExit(f"auto_vs_fastest: no kernels case with auto in {args.results}")
    print(f"{'mask':<16}{'N':>6} {'mode':<8}{'auto ms':>9}{'fastest ms':>11}  {'speed':>5}  {'pick':>5}  "
          "auto chose / fastest")
    for r in table:
        pick = f"{r['pick_speed']:>5.2f}" if r["pick_speed"] is not None else "    -"
        print(f"{r['mask']:<16}{r['N']:>6} {r['mode']:<8}{r['auto_s'] * 1e3:>9.1f}{r['fastest_s'] * 1e3:>11.1f}  "
              f"{r['speed']:>5.2f}  {pick}  {r['chosen']} / {r['fastest']}")
    met = sum(r["speed"] >= args.target for r in table)
    print(f"auto's own run at >= {args.target:.2f}x the fastest backend's speed in {met} of {len(table)} cases; "
          f"lowest {min(r['speed'] for r in table):.2f}")
    picks = [r for r in table if r["pick_speed"] is not None]
    met_pick = sum(r["pick_speed"] >= args.target for r in picks)
    print(f"the backend auto picked, as measured on its own, at >= {args.target:.2f}x the fastest in {met_pick} of "
          f"{len(picks)} cases; lowest {min(r['pick_speed'] for r in picks):.2f}")


if __name__ == "__main__":
    main()
