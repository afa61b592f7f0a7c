"""Fit the bundled profiles' GEMM curve and collectives to the public microbenchmarks, through `autopar profile fit`'s path.

For each bundled profile (a100-80gb, a100-40gb, h100-80gb, h200-141gb, b200-180gb, h800-80gb, gb200-186gb) the rows of
shared/reference/microbench/ that measured its GPU (benchmarks/microbench_tables.py) become one calibration's
`Measurements`; `autopar.calibrate.profile_file.fit_measurements` fits them and `apply_fit` writes the fitted keys
with provenance naming the files — exactly what `autopar profile fit` does with a user's `autopar calibrate` output.
What the tables do not measure is extrapolated by the named rules below (EXTRAPOLATED), and provenance says from what.
A profile no table measured at all (a800-80gb, an export variant: `fit_from_profile`) takes every fitted value from
the part it was cut from, its NVLink collectives scaled to its own link (derive_variant).

    python benchmarks/fit_microbench.py            # fit and print what each profile gets
    python benchmarks/fit_microbench.py --write    # also write costmodels/profiles/*.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as `python benchmarks/NAME.py`: the checkout's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # makes `benchmarks.*` importable

from benchmarks import microbench_tables as tables  # noqa: E402
from autopar.atomic_write import write_text_atomically  # noqa: E402
from autopar.calibrate.profile_file import FlowRow, apply_fit, fit_measurements, profile_dumper  # noqa: E402
from costmodels.hardware import HardwareProfile, parse_profile  # noqa: E402

PROFILES_DIR = Path(__file__).resolve().parent.parent / "costmodels" / "profiles"
ORDER = ("a100-80gb", "a800-80gb", "a100-40gb", "h200-141gb", "h100-80gb", "b200-180gb", "h800-80gb", "gb200-186gb")
"""H200 before H100: H100 takes H200's all-gather / reduce-scatter points (EXTRAPOLATED); B200 before GB200 likewise.
A variant (`fit_from_profile`) is derived after every fit, from its donor's final values (fit_all)."""
STAMP = "fitted by benchmarks/fit_microbench.py (autopar.calibrate.profile_file.fit_measurements, as `autopar " \
        "profile fit`)"

A800_RULE = ("A800 80GB SXM is A100 80GB SXM's part with NVLink cut (Reuters, Nov 2022, as tweakers.net/nieuws/203182 "
             "reports it: the A100's stated performance, 80 GB HBM2e and 400 W, NVLink 400 GB/s against 600): the "
             "same GA100 die, clocks, tensor-core rates and HBM2e, so a kernel's rate, a host launch and a "
             "collective's latency carry over; no microbenchmark here measured an A800")
NVLINK_CUT_RULE = ("every regime's bus bandwidth × the ratio of the nominal NVLink bandwidths per direction "
                   "({variant} / {donor} GB/s), latencies unchanged: on an 8-GPU HGX node every NCCL ring or tree step "
                   "inside the node crosses NVLink through the NVSwitches, so a bandwidth-bound collective runs at the "
                   "link's rate, while the launch and the switch hop are the same silicon")
A800_IB_NOTE = ("the NIC is the cluster's, not the GPU's: one 200 Gb/s HDR NIC per GPU as a100-80gb (the ms-swift "
                "A800 source does not state its fabric)")
A800_NOTES = {
    "links.nvlink.bandwidth_efficiency": "a fraction of this profile's own nominal NVLink bandwidth, so the achieved "
                                         "link rate scales with the cut link as the collectives do",
    "links.ib.": A800_IB_NOTE,
    "collectives.ib.": A800_IB_NOTE,
}
"""Per-key notes of the A800 rule (by key prefix), added to the provenance of the keys they name."""

RING_RULE = ("ring all-reduce is a reduce-scatter followed by an all-gather on the same ring (Thakur et al. 2005; "
             "NCCL ring): each at the all-reduce's bus bandwidth with half its latency")
EXTRAPOLATED: dict[str, dict[str, Any]] = {
    # profile -> what is derived, from what, by which rule
    "a800-80gb": {"fit_from_profile": "a100-80gb", "why": A800_RULE, "nvlink_why": NVLINK_CUT_RULE,
                  "notes_by_prefix": A800_NOTES},
    "a100-80gb": {"ag_rs_from_all_reduce": None, "why": RING_RULE},
    "a100-40gb": {"ag_rs_from_all_reduce": None, "why": RING_RULE},
    "h100-80gb": {"ag_rs_from_profile": "h200-141gb",
                  "why": "H100 and H200 nodes share NVLink4 and the NVSwitch; all_gather/reduce_scatter measured on "
                         "H200 only (nccl_points_nvls_vs_ring_ml_engineering.csv)"},
    "b200-180gb": {"ag_rs_from_all_reduce": (4, 5),
                   "why": RING_RULE + "; B200 all-reduce is ring (NCCL's default) at 4 and 5 GPUs "
                          "(nccl_points_nvls_vs_ring_ml_engineering.csv), NVLS from 6"},
    "gb200-186gb": {"ag_rs_from_profile": "b200-180gb",
                    "why": "GB200 and B200 share the Blackwell GPU, NVLink 5 (900 GB/s per direction) and its switch "
                           "generation; all_gather/reduce_scatter are measured on neither GB200 file (the GB200 "
                           "all-reduce rows are NVLS/MNNVL at 72 GPUs, not a ring)",
                    "notes": {"collectives.ib.all_reduce": (
                        "group sizes count NVL72 racks (NVLink domains), not 4-GPU trays; an effective per-GPU bus "
                        "bandwidth of the inter-rack stage under costmodels.comm's pipelined hierarchical model: the "
                        "20-rack all-reduce runs at half the one-rack bus bandwidth, which the model can only put "
                        "on that stage; the 2-rack rows run at the rack's own rate, so they bound it from below")}},
}


PRIOR_NVLINK = {"alpha_us": 10.0, "bandwidth_efficiency": 0.8}
"""Where the fit starts for the link-level NVLink values (and what stays when a held-out file was a profile's only
NVLink source): NCCL intra-node latency of order 10 µs and 80% of the spec bandwidth, assumptions."""


PRIOR_GEMM = {"peak_fraction": 0.8, "half_saturation_dim": 250.0}
PRIOR_FP8_PEAK_FRACTION = 0.7
"""Where the GEMM fit starts (and what stays where no table measured the GPU, e.g. with a file held out): 80% of the
dense peak with a 250-wide half-saturation side, fp8 at 70% of its peak — assumptions of the order of the MAMF
table's efficiencies, not fitted values."""


def _strip_fitted(data: dict[str, Any]) -> dict[str, Any]:
    """Start from the spec sheet and stated priors, never from an earlier fit of the same tables: drop the
    collectives points, reset the link-level NVLink values and the GEMM curve to the priors and drop the attention
    curve (a held-out file must not leak back through any of them)."""
    data = dict(data)
    data.pop("collectives", None)
    data["links"] = {**data["links"], "nvlink": {**data["links"]["nvlink"], **PRIOR_NVLINK}}
    gemm = dict(PRIOR_GEMM)
    if "fp8" in data["compute"]["peak_tflops"]:
        gemm["fp8_peak_fraction"] = PRIOR_FP8_PEAK_FRACTION
    data["compute"] = {**data["compute"], "gemm_efficiency": gemm}
    data["provenance"] = {key: value for key, value in (data.get("provenance") or {}).items()
                          if not key.startswith("compute.gemm_efficiency.")}
    return data


GEMM_DONORS = (("bf16", "half_saturation_dim", "h100-80gb", "h100-80gb"),
               ("fp8", "fp8_half_saturation_dim", "h100-80gb", "h200-141gb"))
"""Where a GPU measured only MAMF's best shape in a precision (B200, GB200): (precision, curve key, the profile whose
fit gives the roll-off, the profile whose curve and MAMF row give the best shape's share). The roll-off is H100's,
fitted to the shape sweeps (bf16 cuBLAS, fp8 DeepGEMM on H800, H100's HBM): Hopper, not Ampere, because Blackwell's
tensor cores are fed the way Hopper's are (TMA, asynchronous warpgroup-wide MMA on large tiles, 132-148 SMs to fill)
and its machine balance is Hopper's (B200 281 bf16 FLOP per HBM byte, H100 295, A100 153). The share comes from the
same die with a MAMF row in that precision: H100 for bf16, H200 for fp8 (MAMF measured no H100 fp8)."""


def best_shape_share(donor: HardwareProfile, donor_measurements, precision: str) -> "float | None":
    """The donor's fitted curve at its MAMF best shape over MAMF's measured rate there (None without a MAMF row): how
    far a curve that also fits typical shapes sits below the maximum of a brute-force shape sweep (H100 bf16 0.80)."""
    from autopar.calibrate.fit import measured_gemm_efficiency
    from costmodels.compute import gemm_efficiency

    rows = [g for g in donor_measurements.gemm if g.precision == precision and g.kind == "gemm"
            and g.label.startswith(tables.MAMF_LABEL)]
    if not rows:
        return None
    shares = [float(gemm_efficiency(donor, g.m, g.n, g.k, precision)) / measured_gemm_efficiency(g, donor)
              for g in rows]
    return min(1.0, sum(shares) / len(shares))


def _at_share_of_best_shape(measurements, precision: str, share: float):
    """`measurements` with its `precision` GEMM rows (MAMF best shapes only, see GEMM_DONORS) timed 1/share slower."""
    def scaled(g):
        if g.precision != precision or g.kind != "gemm":
            return g
        t = g.timing
        return dataclasses.replace(g, timing=dataclasses.replace(t, median_s=t.median_s / share, q1_s=t.q1_s / share,
                                                                 q3_s=t.q3_s / share))
    return dataclasses.replace(measurements, gemm=tuple(scaled(g) for g in measurements.gemm))


def fit_profile(name: str, rows_by_file: dict[str, list[tables.Row]], fitted: dict[str, HardwareProfile],
                exclude: str | None = None) -> tuple[HardwareProfile, dict[str, Any], list[str]]:
    """The profile fitted to every table but `exclude`: (profile, its YAML data, notes)."""
    import yaml

    text = (PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    data = _strip_fitted(yaml.safe_load(text))
    base = parse_profile(yaml.dump(data, Dumper=profile_dumper(), sort_keys=False), f"bundled:{name}")
    measurements = tables.measurements_for(name, rows_by_file, exclude=exclude)
    rule = EXTRAPOLATED.get(name, {})
    provenance: dict[str, str] = dict(data.get("provenance", {}))
    notes: list[str] = []
    fixed_gemm: list[str] = []
    gemm_notes: list[str] = []
    base = _hold_kernel_floor(name, data, base, fitted, rows_by_file, exclude, fixed_gemm, gemm_notes)
    for precision, key, donor_name, share_donor_name in GEMM_DONORS:
        shapes = {(g.m, g.n, g.k) for g in measurements.gemm if g.precision == precision and g.kind == "gemm"}
        if len(shapes) >= 3 or not base.supports(precision) or donor_name not in fitted or donor_name == name:
            continue
        # a best shape or two (MAMF) pins the peak fraction, not the roll-off: take the donor's fitted side, scaled
        # by machine balance (peak / HBM bandwidth), the roofline the curve comes from
        donor = fitted[donor_name]
        if key not in donor.gemm_efficiency:
            continue
        balance = (base.peak_flops_per_s[precision] / base.hbm_bandwidth_bytes_per_s) / \
            (donor.peak_flops_per_s[precision] / donor.hbm_bandwidth_bytes_per_s)
        side = donor.gemm_efficiency[key] * balance
        data["compute"]["gemm_efficiency"][key] = round(side, 1)
        base = dataclasses.replace(base, gemm_efficiency={**base.gemm_efficiency, key: side})
        fixed_gemm.append(key)
        gemm_notes.append(f"{key} extrapolated from the {donor.name} fit × machine-balance ({precision} peak / HBM "
                          f"bandwidth) ratio {balance:.2f}, {len(shapes)} {precision} shape(s) measured here")
        share = best_shape_share(fitted[share_donor_name], tables.measurements_for(
            share_donor_name, rows_by_file, exclude=exclude), precision) if share_donor_name in fitted else None
        if share is not None:
            measurements = _at_share_of_best_shape(measurements, precision, share)
            gemm_notes.append(f"{precision} MAMF best shape fitted at {share:.2f} of its rate, where the "
                              f"{share_donor_name} curve sits at its own MAMF best shape (a maximum over a "
                              f"brute-force sweep, not a typical shape)")
    held_grouped = _seed_grouped_from_donor(name, data, measurements, fitted)
    if held_grouped:
        base = dataclasses.replace(base, gemm_efficiency={**base.gemm_efficiency, **held_grouped})
    fit = fit_measurements(measurements, base, fixed_gemm=tuple(fixed_gemm))
    apply_fit(data, base, fit, measurements, STAMP, provenance, notes, fixed_gemm=tuple(fixed_gemm))
    held_grouped = {key: value for key, value in held_grouped.items()
                    if fit.grouped is None or key not in fit.grouped.params}
    if held_grouped and "compute.gemm_efficiency.grouped" in provenance:
        provenance["compute.gemm_efficiency.grouped"] += (
            f"; {', '.join(held_grouped)} not determined by these rows: extrapolated, the {GROUPED_DONOR} fit "
            "(fractions of this GPU's own HBM bandwidth and fp8 peak)")
    _hold_undetermined_link_alpha(data, base, measurements, provenance)
    _fit_kernel_floor(name, data, rows_by_file, exclude, gemm_notes)
    if gemm_notes:
        provenance["compute.gemm_efficiency"] += f" ({'; '.join(gemm_notes)})"
    _extrapolate(name, data, provenance, fitted, rule)
    _mark_extrapolated_attention(name, rows_by_file, provenance, exclude)
    for key, note in rule.get("notes", {}).items():
        if key in provenance:
            provenance[key] += f" ({note})"
    data["provenance"] = provenance
    profile = parse_profile(yaml.dump(data, Dumper=profile_dumper(), sort_keys=False), f"fitted:{name}")
    return profile, data, notes


KERNEL_FLOOR_START_US = 5.0
"""Where the kernel floor's fit starts: 5 µs, of the order of a kernel's launch latency on the GPU."""
KERNEL_FLOOR_DONOR = "h100-80gb"
KERNEL_FLOOR_RULE = ("no GEMM sweep below the curve's plateau measured this GPU: the {donor} fit: a kernel starts, "
                     "fills its first wave and drains its last the same way on Blackwell (148 SMs against 132)")


def _hold_kernel_floor(name: str, data: dict[str, Any], base: HardwareProfile, fitted: dict[str, HardwareProfile],
                       rows_by_file, exclude: str | None, fixed_gemm: list[str],
                       gemm_notes: list[str]) -> HardwareProfile:
    """`base` with KERNEL_FLOOR_DONOR's kernel floor (costmodels.compute.KERNEL_FLOOR_US) held, where no cuBLAS sweep
    measured this GPU below the plateau (KERNEL_FLOOR_RULE), before its curve is fitted to what it measured; `base`
    unchanged where one did (`_fit_kernel_floor` fits it after the curve) or for a variant (fit_from_profile takes
    its donor's whole curve)."""
    from costmodels.compute import KERNEL_FLOOR_US

    donor = fitted.get(KERNEL_FLOOR_DONOR)
    if tables.measurements_for(name, rows_by_file, role=tables.SMALL_GEMM_ROLE, exclude=exclude).gemm \
            or "fit_from_profile" in EXTRAPOLATED.get(name, {}) or donor is None \
            or KERNEL_FLOOR_US not in donor.gemm_efficiency:
        return base
    floor_us = donor.gemm_efficiency[KERNEL_FLOOR_US]
    data["compute"]["gemm_efficiency"][KERNEL_FLOOR_US] = floor_us
    fixed_gemm.append(KERNEL_FLOOR_US)
    gemm_notes.append(f"{KERNEL_FLOOR_US} extrapolated: {KERNEL_FLOOR_RULE.format(donor=KERNEL_FLOOR_DONOR)}")
    return dataclasses.replace(base, gemm_efficiency={**base.gemm_efficiency, KERNEL_FLOOR_US: floor_us})


def _fit_kernel_floor(name: str, data: dict[str, Any], rows_by_file, exclude: str | None,
                      gemm_notes: list[str]) -> None:
    """The kernel floor (costmodels.compute.KERNEL_FLOOR_US) fitted to the cuBLAS sweeps' GEMMs under 5 µs of math
    (microbench_tables.SMALL_GEMM_ROLE) with the rest of the curve held at the fit just made (the plateau and roll-off
    are what the larger GEMMs determine; the floor only prices a GEMM where it exceeds the roll-off), through the
    same least squares as `autopar profile fit`."""
    import yaml

    from autopar.calibrate.fit import fit_gemm_efficiency
    from costmodels.compute import KERNEL_FLOOR_US

    small = tables.measurements_for(name, rows_by_file, role=tables.SMALL_GEMM_ROLE, exclude=exclude).gemm
    if not small:
        return
    profile = parse_profile(yaml.dump(data, Dumper=profile_dumper(), sort_keys=False), f"fitted:{name}")
    base = dataclasses.replace(profile, gemm_efficiency={**profile.gemm_efficiency,
                                                         KERNEL_FLOOR_US: KERNEL_FLOOR_START_US})
    floor = fit_gemm_efficiency(small, base, fixed=tuple(k for k in base.gemm_efficiency if k != KERNEL_FLOOR_US))
    data["compute"]["gemm_efficiency"][KERNEL_FLOOR_US] = round(floor.params[KERNEL_FLOOR_US], 3)
    gemm_notes.append(f"{KERNEL_FLOOR_US} then by least squares over the cuBLAS sweeps' {len(small)} GEMMs under "
                      f"5 µs of math, the rest of the curve held, rms residual {floor.rms_relative_residual:.1%} "
                      f"({tables.CUBLAS_SMALL_GEMM_WHY})")


def _hold_undetermined_link_alpha(data: dict[str, Any], base: HardwareProfile, measurements, provenance: dict[str, str]
                                  ) -> None:
    """A link-level alpha fitted without a single message below ALPHA_FROM_BYTES_BELOW (every row in the bandwidth
    regime, e.g. GB200's 512 MiB..8 GiB all-reduce and 200 MB copies, H800's DeepEP buffers) is not determined — the
    per-collective fit's own rule (autopar.calibrate.fit): the base's alpha is kept and the bandwidth refitted with
    it held (the same least squares through costmodels.comm.collective_time_s)."""
    from autopar.calibrate.fit import ALPHA_FROM_BYTES_BELOW, LINK_BOUNDS, least_squares
    from costmodels.comm import collective_time_s
    from costmodels.hardware import LinkSpec

    for link, spec in base.links.items():
        rows = [c for c in measurements.collectives_on(link) if c.ranks_per_node == 1]
        if not rows or min(c.bytes for c in rows) < ALPHA_FROM_BYTES_BELOW:
            continue

        def predict(params, spec=spec, rows=rows):
            held = LinkSpec(bandwidth_bytes_per_s=params["bandwidth_bytes_per_s"], alpha_s=spec.alpha_s,
                            nominal_bandwidth_bytes_per_s=spec.nominal_bandwidth_bytes_per_s)
            return [float(collective_time_s(held, c.kind, c.bytes, c.group_size)) for c in rows]

        result = least_squares(predict, [c.timing.median_s for c in rows],
                               [{"bandwidth_bytes_per_s": spec.bandwidth_bytes_per_s}],
                               bounds={"bandwidth_bytes_per_s": LINK_BOUNDS["bandwidth_bytes_per_s"]})
        efficiency = min(1.0, result.params["bandwidth_bytes_per_s"] / spec.nominal_bandwidth_bytes_per_s)
        data["links"][link]["alpha_us"] = round(spec.alpha_s * 1e6, 4)
        data["links"][link]["bandwidth_efficiency"] = round(efficiency, 6)
        smallest = min(c.bytes for c in rows) / 2**20
        files = ", ".join(sorted({c.source for c in rows if c.source}))
        provenance[f"links.{link}.alpha_us"] = (
            f"base profile {base.name}, {spec.alpha_s * 1e6:g} us: not determined by {files} (the smallest "
            f"single-link message there is {smallest:.0f} MiB, at or above the {ALPHA_FROM_BYTES_BELOW // 2**20} MiB "
            "below which a fit reads latency)")
        provenance[f"links.{link}.bandwidth_efficiency"] += (
            f"; refitted with alpha held at the base value (not determined), rms residual "
            f"{result.rms_relative_residual:.1%}")


def _extrapolate(name: str, data: dict[str, Any], provenance: dict[str, str], fitted: dict[str, HardwareProfile],
                 rule: dict[str, Any]) -> None:
    nvlink = data.setdefault("collectives", {}).setdefault("nvlink", {})
    missing = [kind for kind in ("all_gather", "reduce_scatter") if kind not in nvlink]
    if not missing:
        return
    if "ag_rs_from_profile" in rule and rule["ag_rs_from_profile"] in fitted:
        donor = fitted[rule["ag_rs_from_profile"]]
        for kind in missing:
            points = donor.collectives.get("nvlink", {}).get(kind, ())
            if points:
                nvlink[kind] = [FlowRow({"group_size": p.group_size, "alpha_us": round(p.alpha_s * 1e6, 4),
                                          "busbw_gb_per_s": round(p.bus_bandwidth_bytes_per_s / 1e9, 4)})
                                for p in points]
                provenance[f"collectives.nvlink.{kind}"] = (f"extrapolated: the {donor.name} fit "
                                                             f"({rule['why']})")
    elif "ag_rs_from_all_reduce" in rule and "all_reduce" in nvlink:
        groups = rule["ag_rs_from_all_reduce"]
        source = [p for p in nvlink["all_reduce"] if groups is None or p["group_size"] in groups]
        for kind in missing if source else ():
            nvlink[kind] = [FlowRow({"group_size": p["group_size"], "alpha_us": round(p["alpha_us"] / 2.0, 4),
                                      "busbw_gb_per_s": p["busbw_gb_per_s"]}) for p in source]
            provenance[f"collectives.nvlink.{kind}"] = (
                f"extrapolated from this profile's fitted collectives.nvlink.all_reduce"
                f"{'' if groups is None else ' at ' + ', '.join(map(str, groups)) + ' GPUs'} ({rule['why']})")


def _mark_extrapolated_attention(name: str, rows_by_file: dict[str, list[tables.Row]], provenance: dict[str, str],
                                 exclude: str | None) -> None:
    """An attention curve fitted to rows carried over from another GPU (microbench_tables: FA2_RULE, SAME_DIE_RULE)
    says so first in its provenance, with the rule."""
    for file, rows in rows_by_file.items():
        if file == exclude:
            continue
        for row in rows:
            if name not in row.profiles or row.role != "fit" or not row.extrapolated \
                    or getattr(row.measurement, "kind", "") != "attention":
                continue
            key = f"compute.gemm_efficiency.attention_{row.measurement.attention_kernel}_" \
                  f"{row.measurement.attention_pass}"
            if key in provenance and not provenance[key].startswith("extrapolated"):
                provenance[key] = f"extrapolated ({row.extrapolated}); {provenance[key]}"


def fit_all(rows_by_file: dict[str, list[tables.Row]], exclude: str | None = None
            ) -> dict[str, tuple[HardwareProfile, dict[str, Any], list[str]]]:
    out: dict[str, tuple[HardwareProfile, dict[str, Any], list[str]]] = {}
    fitted: dict[str, HardwareProfile] = {}
    variants = [name for name in ORDER if "fit_from_profile" in EXTRAPOLATED.get(name, {})]
    for name in ORDER:
        if name not in variants:
            out[name] = fit_profile(name, rows_by_file, fitted, exclude)
            fitted[name] = out[name][0]
    _extrapolate_grouped(out)
    for name in variants:
        out[name] = derive_variant(name, out[EXTRAPOLATED[name]["fit_from_profile"]][1], EXTRAPOLATED[name])
    return {name: out[name] for name in ORDER}


FITTED_SECTIONS = ("compute.gemm_efficiency", "collectives.", "host.")
"""Provenance keys (and their sections) a fit writes, besides each link's bandwidth_efficiency and alpha_us."""


def _is_fitted_key(key: str, links: "dict[str, Any]") -> bool:
    return key.startswith(FITTED_SECTIONS) or any(
        key in (f"links.{link}.bandwidth_efficiency", f"links.{link}.alpha_us") for link in links)


def _scaled_bus_bandwidth(points: list[dict[str, Any]], factor: float) -> list[FlowRow]:
    """Collective regimes with their bus bandwidth × factor, latency as it was."""
    return [FlowRow(point, busbw_gb_per_s=round(point["busbw_gb_per_s"] * factor, 4)) for point in points]


def derive_variant(name: str, donor_data: dict[str, Any], rule: dict[str, Any]
                   ) -> tuple[HardwareProfile, dict[str, Any], list[str]]:
    """An export variant no table measured (EXTRAPOLATED `fit_from_profile`): its own YAML states its spec (the same
    die and memory as the donor, its own NVLink), and every fitted value is the donor's fit — the GEMM, attention and
    grouped curves, each link's efficiency and latency, the host costs, the collectives — with the NVLink
    collectives' bus bandwidths scaled by the ratio of the two nominal NVLink bandwidths (rule["nvlink_why"]).
    Each such key's provenance names the rule, then the donor's own provenance."""
    import copy

    import yaml

    data = _strip_fitted(yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8")))
    donor = donor_data["name"]
    variant_gb_per_s = data["links"]["nvlink"]["bandwidth_gb_per_s"]
    donor_gb_per_s = donor_data["links"]["nvlink"]["bandwidth_gb_per_s"]
    ratio = variant_gb_per_s / donor_gb_per_s
    data["compute"]["gemm_efficiency"] = copy.deepcopy(donor_data["compute"]["gemm_efficiency"])
    for link, values in data["links"].items():
        donor_link = donor_data["links"][link]
        values.update(bandwidth_efficiency=donor_link["bandwidth_efficiency"], alpha_us=donor_link["alpha_us"])
    data["collectives"] = {link: {kind: _scaled_bus_bandwidth(points, ratio if link == "nvlink" else 1.0)
                                  for kind, points in kinds.items()}
                           for link, kinds in donor_data.get("collectives", {}).items()}
    if "host" in donor_data:
        data["host"] = dict(donor_data["host"])
    provenance = {key: value for key, value in data.get("provenance", {}).items()
                  if not _is_fitted_key(key, data["links"])}
    nvlink_why = rule["nvlink_why"].format(variant=f"{variant_gb_per_s:g}", donor=f"{donor_gb_per_s:g}")
    for key, source in donor_data["provenance"].items():
        if not _is_fitted_key(key, data["links"]):
            continue
        nvlink_collective = key.startswith("collectives.nvlink.")
        scaled = f"; NVLink bus bandwidths × {ratio:.4g} ({nvlink_why})" if nvlink_collective else ""
        notes = "".join(f"; {note}" for prefix, note in rule.get("notes_by_prefix", {}).items()
                        if key.startswith(prefix))
        provenance[key] = f"extrapolated: the {donor} value ({rule['why']}){scaled}{notes}; {donor}: {source}"
    data["provenance"] = provenance
    return parse_profile_data(data, name), data, []


GROUPED_DONOR = "h100-80gb"
"""The GPU with fp8 grouped expert-GEMM measurements (DeepGEMM on H800 = H100 SXM compute and HBM3): the donor of
the roofline's HBM fraction and fp8 compute fraction."""
GROUPED_BF16_DONORS = {"gb200-186gb": "b200-180gb"}
"""Profiles that take another's fitted grouped_bf16_peak_fraction (the bf16 grouped GEMM's fraction of its own
bf16 peak): GB200 and B200 are the same Blackwell die and run the same torch._grouped_mm kernels; no bf16 grouped
GEMM was measured on GB200."""


def _donor_grouped_keys(profile: HardwareProfile, donor: HardwareProfile) -> dict[str, float]:
    """The donor's grouped-roofline fractions this GPU can use (the fp8 one only where it has fp8)."""
    from costmodels.moe_kernels import GROUPED_PARAMETERS

    keys = [key for key in GROUPED_PARAMETERS if key != "grouped_peak_fraction" or profile.supports("fp8")]
    return {key: donor.gemm_efficiency[key] for key in keys if key in donor.gemm_efficiency}


def _seed_grouped_from_donor(name: str, data: dict[str, Any], measurements,
                             fitted: dict[str, HardwareProfile]) -> dict[str, float]:
    """A profile whose own grouped-GEMM rows are all bf16 (B200's torch._grouped_mm rows: no fp8, and compute-bound,
    so they fit neither the fp8 fraction nor the HBM one) starts its fit from the donor's values, so what the fit
    holds is the donor's, as it would be for a profile with no rows at all. Returns the seeded keys."""
    grouped = [row for row in measurements.gemm if row.kind == "grouped_gemm"]
    if name == GROUPED_DONOR or GROUPED_DONOR not in fitted or not grouped or \
            any(row.precision != "bf16" for row in grouped):
        return {}
    base = parse_profile_data(data, name)
    seeded = _donor_grouped_keys(base, fitted[GROUPED_DONOR])
    data["compute"]["gemm_efficiency"].update(seeded)
    return seeded


def parse_profile_data(data: dict[str, Any], name: str) -> HardwareProfile:
    import yaml

    return parse_profile(yaml.dump(data, Dumper=profile_dumper(), sort_keys=False), f"fitted:{name}")


def _extrapolate_grouped(out: dict[str, tuple[HardwareProfile, dict[str, Any], list[str]]]) -> None:
    """Profiles without grouped-GEMM rows take the donor's two fitted fractions (of HBM bandwidth, and of the fp8
    peak where the GPU has fp8): the roofline's parts scale with each GPU's own bandwidth and peak. A profile of
    GROUPED_BF16_DONORS also takes its donor's bf16 compute fraction."""
    from costmodels.moe_kernels import GROUPED_BF16_PEAK_FRACTION, GROUPED_PARAMETERS

    donor = out.get(GROUPED_DONOR)
    if donor is None or not all(key in donor[0].gemm_efficiency for key in GROUPED_PARAMETERS):
        return
    for name, (profile, data, notes) in list(out.items()):
        efficiency = data["compute"]["gemm_efficiency"]
        provenance = data["provenance"]
        if not all(key in profile.gemm_efficiency for key in GROUPED_PARAMETERS):
            keys = _donor_grouped_keys(profile, donor[0])
            efficiency.update(keys)
            provenance["compute.gemm_efficiency.grouped"] = (
                f"extrapolated: the {GROUPED_DONOR} fit ({', '.join(keys)}: fractions of this GPU's own HBM "
                f"bandwidth{' and fp8 peak' if len(keys) > 1 else ''}; no grouped GEMM measured on it)")
        bf16_donor = out.get(GROUPED_BF16_DONORS.get(name, ""))
        if bf16_donor is not None and GROUPED_BF16_PEAK_FRACTION in bf16_donor[0].gemm_efficiency:
            efficiency[GROUPED_BF16_PEAK_FRACTION] = bf16_donor[0].gemm_efficiency[GROUPED_BF16_PEAK_FRACTION]
            provenance["compute.gemm_efficiency.grouped"] += (
                f"; {GROUPED_BF16_PEAK_FRACTION}: extrapolated, the {bf16_donor[0].name} fit (the same Blackwell "
                "die and torch._grouped_mm kernels; a fraction of this GPU's own bf16 peak)")
        out[name] = (parse_profile_data(data, name), data, notes)


def profile_text(name: str, data: dict[str, Any]) -> str:
    """The bundled YAML's text for `data`: its leading comment lines kept, the data dumped in its key order."""
    import yaml

    path = PROFILES_DIR / f"{name}.yaml"
    header = "".join(line + "\n" for line in path.read_text(encoding="utf-8").splitlines()
                     if line.startswith("#"))
    header = header.split("\n# Collectives")[0].rstrip("\n") + "\n"
    order = ["schema_version", "name", "display_name", "aliases", "gpus_per_node", "nvlink_domain_size", "memory", "compute",
             "elementwise", "overlap", "links", "collectives", "provenance"]
    ordered = {key: data[key] for key in order if key in data}
    ordered.update({key: value for key, value in data.items() if key not in ordered})
    text = header + yaml.dump(ordered, Dumper=profile_dumper(), sort_keys=False, width=100_000, allow_unicode=True)
    parse_profile(text, str(path))
    return text


def write(name: str, data: dict[str, Any]) -> None:
    """Rewrite the bundled YAML (profile_text)."""
    path = PROFILES_DIR / f"{name}.yaml"
    write_text_atomically(path, profile_text(name, data))
    print(f"wrote {path}")


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fitted values into costmodels/profiles/")
    args = parser.parse_args(argv)
    rows_by_file = tables.all_rows()
    results = fit_all(rows_by_file)
    for name, (profile, data, notes) in results.items():
        print(f"== {name}")
        print("  gemm_efficiency: " + ", ".join(f"{k}={v:.4g}" for k, v in profile.gemm_efficiency.items()))
        for link, kinds in profile.collectives.items():
            for kind, points in kinds.items():
                print(f"  {link} {kind}: " + "; ".join(f"{p.group_size}: {p.alpha_s * 1e6:.1f} µs "
                                                        f"{p.bus_bandwidth_bytes_per_s / 1e9:.0f} GB/s"
                                                        for p in points))
        for link, spec in profile.links.items():
            print(f"  links.{link}: alpha {spec.alpha_s * 1e6:.1f} µs, {spec.bandwidth_bytes_per_s / 1e9:.0f} GB/s")
        for note in notes:
            print(f"  note: {note}")
        if args.write:
            write(name, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
