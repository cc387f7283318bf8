"""Layer-adaptive selection policies for the selection-cost study: each layer runs the cheapest candidate that keeps
its mass on a calibration context (``selection_study`` rows and records)."""

from __future__ import annotations

from locks_studies.selection_study import Candidate

#: candidates a layer-adaptive policy picks from (every layer scores: no reuse across layers)
ADAPTIVE_POOL = ("flat r8 fused (e)", "flat int4 r8", "flat r4", "2L pagecent c32", "2L pagecent c16", "2L pagecent c8",
                 "2L centroid c32",
                 "2L centroid c16", "2L centroid c8", "2L centroid c4", "2L pagecent SP8 c8", "reuse k2", "reuse k4",
                 "2L pagecent c8 + k4", "2L pagecent c16 + k2", "2L centroid c4 + k4", "2L centroid c4 + k8")


#: the buildable subset: one coarse kind (superpage centroids), a candidate count per layer, or the flat scan
CENTROID_POOL = ("flat r8 fused (e)", "2L centroid c4", "2L centroid c8", "2L centroid c16", "2L centroid c32")
#: (name, threshold, pool): an absolute mean, or, when negative, the flat scan's mean on the layer plus it
POLICIES = (("layer-adaptive 0.99", 0.99, ADAPTIVE_POOL), ("layer-adaptive flat-0.005", -0.005, ADAPTIVE_POOL),
            ("layer-adaptive flat-0.01", -0.01, ADAPTIVE_POOL),
            ("centroid c or flat, flat-0.005", -0.005, CENTROID_POOL))


def layer_adaptive(recs: list[dict], calib_rows: list[dict], policies=POLICIES) -> list[dict]:
    """Records of layer-adaptive policies: each layer runs the cheapest candidate of the policy's pool (bytes at
    D = 64) whose mean mass kept on that layer, measured on ``calib_rows`` (the calibration context, same budget),
    reaches the threshold (``POLICIES``); the flat scan where none does."""
    out = []
    for name, tau, names in policies:
        cand = Candidate(name, "adaptive")
        for frac in sorted({r["budget_frac"] for r in calib_rows}):
            rows = [r for r in calib_rows if r["budget_frac"] == frac]
            pool = sorted((r for r in rows if r["candidate"] in names), key=lambda r: r["bytes_pct_d64"])
            flat = next(r for r in rows if r["candidate"] == "flat r8 fused (e)")["mass_layer_means"]
            for rec in recs:
                if rec["frac"] != frac or rec["cand"].name not in names:
                    continue
                layer = rec["layer"]
                need = tau if tau > 0 else flat[layer] + tau
                pick = next((r["candidate"] for r in pool if r["mass_layer_means"][layer] >= need),
                            "flat r8 fused (e)")
                if rec["cand"].name == pick:
                    out.append({**rec, "cand": cand, "source": rec["cand"]})
    return out
