"""`tfelastic plot EVENTS.jsonl -o timeline.png`: world size and step rate over time.

Failures are red dashed lines, node joins green ticks, so a glance shows how
long each recovery took and what the job ran at in between.
"""

from __future__ import annotations

import argparse
import sys

from tensorflow_elastic.observability import timeline as timeline_lib


def plot_timeline(timeline: timeline_lib.Timeline, output: str, title: str = "") -> None:
    """Writes a PNG (or any format matplotlib knows by the file's extension) of ``timeline``."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("tfelastic plot needs matplotlib: pip install "
                           "'tensorflow-elastic[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    t0 = timeline.start
    fig, (ax_world, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(10, 6),
                                            gridspec_kw={"height_ratios": [1, 2]})
    if timeline.world:
        xs = [t - t0 for t, _ in timeline.world]
        ys = [w for _, w in timeline.world]
        end = max([t for t, _ in timeline.steps] + [timeline.world[-1][0]]) - t0
        ax_world.step(xs + [end], ys + [ys[-1]], where="post", color="tab:blue", linewidth=2)
        ax_world.set_ylim(0, max(ys) + 1)
    ax_world.set_ylabel("world size")
    ax_world.yaxis.get_major_locator().set_params(integer=True)

    rates = timeline.step_rates()
    if rates:
        ax_rate.plot([t - t0 for t, _ in rates], [r for _, r in rates], color="tab:orange",
                     marker=".", linewidth=1)
    ax_rate.set_ylabel("steps / s")
    ax_rate.set_xlabel("seconds since the first event")

    for i, incident in enumerate(timeline.incidents):
        for ax in (ax_world, ax_rate):
            ax.axvline(incident.time - t0, color="tab:red", linestyle="--", linewidth=1,
                       label="failure" if i == 0 and ax is ax_world else None)
    for i, (t, node) in enumerate(timeline.joins):
        ax_world.axvline(t - t0, color="tab:green", linestyle=":", linewidth=1,
                         label="node joined" if i == 0 else None)
    if timeline.incidents or timeline.joins:
        ax_world.legend(loc="lower right", fontsize="small")
    ax_world.set_title(title or "tensorflow_elastic job timeline")
    for ax in (ax_world, ax_rate):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Adds `plot` to the `tfelastic` command."""
    plot = commands.add_parser(
        "plot", help="plot world size and step rate over time from an events file",
        description="Reads the events file of a job (--events_file of tfelastic-run) and draws "
                    "its world size and step rate over time, marking failures and joins; prints "
                    "a summary with recovery times and lost steps.")
    plot.add_argument("events_file", metavar="EVENTS.jsonl", help="the job's events file")
    plot.add_argument("-o", "--output", default="timeline.png",
                      help="image to write (default: %(default)s)")
    plot.add_argument("--title", default="", help="title of the plot")
    plot.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        timeline = timeline_lib.load(args.events_file)
        plot_timeline(timeline, args.output, args.title)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"tfelastic plot: {e}", file=sys.stderr)
        return 1
    print(timeline_lib.summary(timeline))
    print(f"wrote {args.output}")
    return 0
