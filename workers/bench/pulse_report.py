"""Plain-text report of `spotlight bench pulse` figures (the --json output holds every number)."""

from __future__ import annotations

from workers.bench.pulse import TARGETS


def format_pulse_report(figures: dict) -> str:
    """A few aligned tables: per-k sparsity and size, entropy floor, speed, zstd levels, targets."""
    model, run = figures["model"], figures["trajectory"]
    lines = [
        f"PULSESync bench{' (quick)' if figures['quick'] else ''}: decoder-only LM, "
        f"{model['num_parameters'] / 1e6:.1f}M parameters, AdamW lr {run['lr']:g}, "
        f"{figures['num_states']} states, {figures['wall_s']:.0f} s",
        "",
        f"{'k':>3} {'changed %':>10} {'abs B/chg':>10} {'ulp B/chg':>10} {'abs x':>8} {'ulp x':>8}",
    ]
    lines += _k_rows(figures["by_k"])
    lines += ["", *_detail_lines("trajectory k=1", figures["detailed_k1"])]
    lines += _detail_lines("synthetic 1 % changed, +-1 ULP", figures["synthetic_1pct"])
    lines += ["", f"{'zstd':>5} {'abs B/chg':>10} {'ulp B/chg':>10} {'abs enc GB/s':>13} {'ulp enc GB/s':>13}"]
    for level, row in sorted(figures["zstd_levels_k1"].items(), key=lambda item: int(item[0])):
        lines.append(
            f"{level:>5} {row['absolute_bytes_per_changed']:>10.2f} {row['ulp_delta_bytes_per_changed']:>10.2f} "
            f"{row['absolute_encode_gbps']:>13.2f} {row['ulp_delta_encode_gbps']:>13.2f}"
        )
    lines += ["", f"{'target':<32} {'measured':>10} {'wanted':>10}  met"]
    if figures["quick"]:
        lines.append("(quick run: the targets are set for the 54.7M model of the full run, not this one)")
    for name in TARGETS:
        target = figures["targets"][name]
        value = "n/a" if target["value"] is None else f"{target['value']:.2f}"
        lines.append(f"{name:<32} {value:>10} {target['target']:>10}  {'yes' if target['met'] else 'NO'}")
    lines.append(
        f"bit-exact round trips: {figures['bitwise_exact'] and figures['synthetic_1pct']['absolute_bitwise_exact']}"
    )
    lines += _dit_lines(figures.get("dit_grpo", {}))
    return "\n".join(lines)


def _dit_lines(dit: dict) -> list[str]:
    """(a) The tiny DiT's GRPO trajectories, one block per learning rate."""
    lines = []
    for name, fig in dit.items():
        lines += [
            "",
            f"tiny DiT, GRPO {name}: {fig['num_states']} states, {fig['dense_bytes'] / 1e6:.1f} MB dense BF16",
        ]
        lines += _k_rows(fig["by_k"])
    return lines


def _k_rows(by_k: dict) -> list[str]:
    """One line per k: changed %, bytes per changed value and ratio vs dense, both modes."""
    return [
        f"{k:>3} {100 * row['changed_fraction_mean']:>10.2f} {row['absolute_bytes_per_changed']:>10.2f} "
        f"{row['ulp_delta_bytes_per_changed']:>10.2f} {row['absolute_ratio_vs_dense']:>8.1f} "
        f"{row['ulp_delta_ratio_vs_dense']:>8.1f}"
        for k, row in sorted(by_k.items(), key=lambda item: int(item[0]))
        if row["num_pairs"]
    ]


def _detail_lines(title: str, row: dict) -> list[str]:
    if not row:
        return [f"{title}: no pairs"]
    return [
        f"{title}: {100 * row['changed_fraction']:.2f} % changed; "
        f"B/changed abs {row['absolute_bytes_per_changed']:.2f} "
        f"(floor {row['entropy_floor_absolute_bytes_per_changed']:.2f} = index "
        f"{row['entropy_floor_index_bytes_per_changed']:.2f} "
        f"+ value {row['entropy_floor_value_bytes_per_changed']:.2f}), "
        f"ulp {row['ulp_delta_bytes_per_changed']:.2f} (floor {row['entropy_floor_ulp_delta_bytes_per_changed']:.2f}); "
        f"x{row['absolute_ratio_vs_dense']:.0f} / x{row['ulp_delta_ratio_vs_dense']:.0f} vs dense",
        f"  one core, GB/s of dense model (wall median | CPU time): encode abs {row['absolute_encode_gbps']:.2f} | "
        f"{row['absolute_encode_gbps_cpu']:.2f}, "
        f"ulp {row['ulp_delta_encode_gbps']:.2f} | {row['ulp_delta_encode_gbps_cpu']:.2f}; "
        f"apply abs {row['absolute_apply_gbps']:.2f} | {row['absolute_apply_gbps_cpu']:.2f}, "
        f"ulp {row['ulp_delta_apply_gbps']:.2f} | {row['ulp_delta_apply_gbps_cpu']:.2f}; hash {row['hash_gbps']:.1f}",
    ]
