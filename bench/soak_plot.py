#!/usr/bin/env python3
"""Draws the soak's samples (`cargo run --release -p bench -- soak`).

Usage: soak_plot.py <soak.csv> <out.png>

Top: the server's and its workers' RSS against the turn, with the warm-up
(the first 10 % of the turns) shaded and the ±10 % band around the server's
median after it. Bottom: `session.sqlite` (+ `-wal`) and the prompt
response (the whole snapshot), and the time per turn.
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, out):
    with open(src, newline="") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        sys.exit("no samples")
    turn = [r["turn"] for r in rows]
    last = turn[-1] + (turn[1] - turn[0] if len(turn) > 1 else 1)
    warm = last / 10
    mib = lambda key: [r[key] / 1024 for r in rows]  # noqa: E731
    server, workers = mib("server_rss_kib"), mib("workers_rss_kib")
    after = sorted(s for t, s in zip(turn, server) if t >= warm)
    median = after[len(after) // 2]

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 7), sharex=True, height_ratios=[3, 2]
    )
    top.axvspan(0, warm, color="0.92", label="warm-up (first 10 %)")
    top.axhspan(median * 0.9, median * 1.1, color="tab:blue", alpha=0.08,
                label="server median ±10 %")
    top.plot(turn, server, color="tab:blue", label="server RSS")
    top.plot(turn, workers, color="tab:orange", label="worker RSS (long session)")
    top.set_ylabel("RSS (MiB)")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left", fontsize="small")
    top.set_title("pi-server soak: one session, reconnects, sessions created and removed")

    bottom.plot(turn, [r["store_bytes"] / 1048576 for r in rows], color="tab:green",
                label="session.sqlite + -wal")
    bottom.plot(turn, [r["response_bytes"] / 1048576 for r in rows], color="tab:red",
                label="prompt response (whole snapshot)")
    bottom.set_ylabel("MiB")
    bottom.set_xlabel("turn")
    bottom.set_ylim(bottom=0)
    per_turn = bottom.twinx()
    per_turn.plot(turn[1:], [r["turn_ms"] for r in rows[1:]], color="0.5",
                  linestyle=":", label="ms per turn")
    per_turn.set_ylabel("ms per turn")
    per_turn.set_ylim(bottom=0)
    lines = bottom.get_legend_handles_labels()
    more = per_turn.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left",
                  fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
