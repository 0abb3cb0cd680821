"""Plot the accuracy ledger's curves: the markdown tables that bench/trainer/ledger.sh writes
(OUT_MD: a `| step | exact-s1 | ... |` table), one panel per table, each choice's eval loss
relative to the exact runs' mean at the same step, with the exact runs' spread shaded.

    python3 bench/trainer/plot_ledger.py OUT.png TITLE=LEDGER.md [TITLE=LEDGER.md ...]

Needs matplotlib (not a project dependency: `pip install matplotlib` where you plot).
"""
import sys


def read_table(path):
    """{column: {step: value}} from the first markdown table in path."""
    header, rows = None, []
    with open(path) as f:
        for line in f:
            if not line.startswith("|"):
                if header:
                    break
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(cells[0]) <= set("-"):
                rows.append(cells)
    if header is None or header[0] != "step":
        sys.exit(f"plot_ledger: {path} holds no '| step | ...' table")
    cols = {name: {} for name in header[1:]}
    for cells in rows:
        for name, cell in zip(header[1:], cells[1:]):
            if cell not in ("", "nan"):
                cols[name][int(cells[0])] = float(cell)
    return cols


def panel(ax, title, cols):
    exact = [c for c in cols if c.startswith("exact-")]
    if not exact:
        sys.exit(f"plot_ledger: '{title}' has no exact-s* column")
    steps = sorted(s for s in cols[exact[0]] if all(s in cols[c] for c in exact))
    mean = {s: sum(cols[c][s] for c in exact) / len(exact) for s in steps}
    lo = [100 * (min(cols[c][s] for c in exact) / mean[s] - 1) for s in steps]
    hi = [100 * (max(cols[c][s] for c in exact) / mean[s] - 1) for s in steps]
    ax.fill_between(steps, lo, hi, color="0.85", label=f"exact, {len(exact)} seeds (spread)")
    for name, curve in cols.items():
        if name in exact:
            continue
        xs = [s for s in steps if s in curve]
        ax.plot(xs, [100 * (curve[s] / mean[s] - 1) for s in xs], label=name.replace(",", " + "))
    ax.axhline(0, color="0.4", linewidth=0.8)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel("eval loss vs exact mean (%)")
    ax.set_ylim(-4, 12)
    ax.legend(fontsize=7)


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        sys.exit(__doc__)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [a.split("=", 1) for a in sys.argv[2:]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, path) in zip(axes[0], panels):
        panel(ax, title, read_table(path))
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)
    print(f"plot_ledger: wrote {sys.argv[1]}")


if __name__ == "__main__":
    main()
