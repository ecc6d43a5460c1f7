#!/usr/bin/env python3
"""The communication cost model of docs/performance.md, fitted and checked on
measured collectives, then used to predict multi-node DDP.

  bench/cost_model.py [--comm bench/results/comm_bandwidth.json]
                      [--strategies bench/results/strategies.json]
                      [--json bench/results/cost_model.json] [--check]

--check writes nothing and exits 1 when the JSON differs from what its
inputs give (CTest bench_cost_model: a re-measured input without a re-run
of this script, or a change to the script, fails CI).

Model (a ring over N ranks, S the larger buffer in bytes, B the bus
bandwidth, alpha a fixed cost per collective):
    all_reduce       t = alpha + 2 (N-1)/N * S / B
    reduce_scatter   t = alpha +   (N-1)/N * S / B
    all_gather       t = alpha +   (N-1)/N * S / B
    broadcast        t = alpha +             S / B   (pipelined)
For each transport, alpha and B are fitted by least squares to the
all-reduce times alone. Each all-reduce size is checked
against a fit to the other sizes (leave one out), and the other three
collectives are predicted from the all-reduce fit and compared with their
measurements. Last, the
gradient all-reduce of the benchmark MLP is predicted for N nodes joined by
links of given bandwidths, beside its measured compute time, giving the
scaling efficiency DDP reaches when nothing overlaps and when everything
does.
"""
import argparse
import json
import sys

FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
# PyTorch's flat-tensor forms move the same bytes as the list forms.
FACTOR["all_gather_into_tensor"] = FACTOR["all_gather"]
FACTOR["reduce_scatter_tensor"] = FACTOR["reduce_scatter"]


def fail(msg):
    print(f"cost_model.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"cannot read {path}: {e} (run the benchmark that writes it, see docs/performance.md)")


def fit(points):
    """t = alpha + x / B over (x, t) pairs, ordinary least squares (the large
    sizes, where bandwidth decides, dominate); returns alpha (s) and B
    (bytes/s)."""
    if len(points) < 2:
        fail("need at least two all-reduce sizes to fit the model")
    w = [1.0 for _ in points]
    sw = sum(w)
    mx = sum(wi * x for wi, (x, _) in zip(w, points)) / sw
    mt = sum(wi * t for wi, (_, t) in zip(w, points)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, (x, _) in zip(w, points))
    sxt = sum(wi * (x - mx) * (t - mt) for wi, (x, t) in zip(w, points))
    slope = sxt / sxx
    alpha = mt - slope * mx
    return max(alpha, 0.0), 1.0 / slope


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comm", default="bench/results/comm_bandwidth.json")
    ap.add_argument("--strategies", default="bench/results/strategies.json")
    ap.add_argument("--json", default="bench/results/cost_model.json")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    comm = load(args.comm)
    strat = load(args.strategies)
    # Derived, not measured: the provenance (date, commit, dirty, machine) is
    # the measured collectives' (comm_bandwidth.json), with its note where it
    # has one; strategies_* give the scaling rows' (strategies.json). Taken
    # from the inputs, never from this run, so --check compares like with like.
    out = {"date": comm.get("date"), "commit": comm.get("commit"), "dirty": comm.get("dirty"),
           "machine": comm.get("machine")}
    notes = [f"{name}: {d['provenance_note']}" for name, d in ((args.comm, comm), (args.strategies, strat))
             if d.get("provenance_note")]
    if notes:
        out["provenance_note"] = ("derived by bench/cost_model.py: date, commit, dirty and machine are "
                                  f"{args.comm}'s, strategies_* are {args.strategies}'s; their notes: "
                                  + " | ".join(notes))
    out.update({"source": args.comm, "model": "t = alpha + factor(N) * S / B", "transports": []})

    # dtrain's two host transports, PyTorch from PyPI (the release users
    # install) and Debian's PyTorch, each over Gloo.
    for key in ("dtrain_shm", "dtrain_gloo", "torch_peer", "torch"):
        if key not in comm:
            continue
        run = comm[key]
        n = run["world_size"]
        rows = [r for r in run["results"] if r.get("time_us") is not None]  # torch's gloo has no reduce_scatter
        ar = [(FACTOR["all_reduce"](n) * r["bytes"], r["time_us"] * 1e-6) for r in rows if r["collective"] == "all_reduce"]
        alpha, bw = fit(ar)
        checks = []
        for r in rows:
            meas = r["time_us"] * 1e-6
            a, b = alpha, bw
            if r["collective"] == "all_reduce":
                # Leave one out: the all-reduce of this size predicted from the others.
                a, b = fit([p for p in ar if p[0] != FACTOR["all_reduce"](n) * r["bytes"]])
            pred = a + FACTOR[r["collective"]](n) * r["bytes"] / b
            checks.append({"collective": r["collective"], "bytes": r["bytes"], "measured_us": round(meas * 1e6, 1),
                           "predicted_us": round(pred * 1e6, 1), "error_pct": round(100 * (pred - meas) / meas, 1)})
        out["transports"].append({"name": run["implementation"], "transport": run.get("transport", ""), "world_size": n,
                                  "alpha_us": round(alpha * 1e6, 1), "bus_bandwidth_gbps": round(bw / 1e9, 3),
                                  "checks": checks})

    print(f"Cost model fitted on the all-reduce times of {args.comm} (2 ranks, one node):\n")
    print("| implementation | alpha (us) | B (GB/s) |\n|---|---:|---:|")
    for t in out["transports"]:
        print(f"| {t['name']} | {t['alpha_us']:.1f} | {t['bus_bandwidth_gbps']:.3f} |")
    print("\nPredicted against measured (all-reduce: each size from a fit to the other sizes; the others from the"
          " all-reduce fit):\n")
    print("| implementation | collective | MiB | measured ms | predicted ms | error |\n|---|---|---:|---:|---:|---:|")
    for t in out["transports"]:
        for c in t["checks"]:
            print(f"| {t['name']} | {c['collective']} | {c['bytes'] / 2**20:g} | "
                  f"{c['measured_us'] / 1000:.2f} | {c['predicted_us'] / 1000:.2f} | {c['error_pct']:+.0f}% |")

    # Scaling measured on one machine: samples/s at N ranks over samples/s at
    # one rank, every strategy (the machine's cores are shared by the ranks,
    # so this measures what distribution costs on fixed hardware).
    out["strategies_date"] = strat.get("date")
    out["strategies_machine"] = strat.get("machine")
    out["strategies_commit"] = strat.get("commit")
    out["strategies_dirty"] = strat.get("dirty")
    scaling = []
    base = {}
    print(f"\nScaling on one machine ({strat['machine'].get('cores', '?')} cores shared by the ranks; {args.strategies}):\n")
    print("| implementation | strategy | ranks | samples/s | vs 1 rank |\n|---|---|---:|---:|---:|")
    for res in sorted(strat["results"], key=lambda r: r["ranks"]):
        for row in res["rows"]:
            if row.get("shard_group") not in (None, res["ranks"]):
                continue
            key = (row["implementation"], row["strategy"], row.get("precision", ""))
            base.setdefault(key, row["samples_per_s"])
            eff = row["samples_per_s"] / base[key]
            name = row["implementation"] + (f" ({row['precision']})" if row.get("precision") else "")
            scaling.append({"implementation": name, "strategy": row["strategy"], "ranks": res["ranks"],
                            "samples_per_s": row["samples_per_s"], "vs_one_rank": round(eff, 3)})
            print(f"| {name} | {row['strategy']} | {res['ranks']} | {row['samples_per_s']:,.0f} | {eff:.2f} |")
    out["scaling_one_machine"] = scaling

    # Multi-node DDP: the benchmark MLP's fp32 gradient all-reduce over N
    # nodes, against its compute time per step at one rank.
    params = strat["model"]["parameters"]
    one = next(r for r in strat["results"] if r["ranks"] == 1)
    ddp1 = next(x for x in one["rows"] if x["implementation"] == "dtrain" and x["strategy"] == "ddp")
    compute_ms = ddp1["step_ms"]
    grad_bytes = 4 * params
    gloo = next((t for t in out["transports"] if t["name"].startswith("dtrain gloo")), out["transports"][0])
    alpha = gloo["alpha_us"] * 1e-6
    links = {"10 Gb/s Ethernet": 1.25e9, "25 Gb/s Ethernet": 3.125e9, "100 Gb/s InfiniBand": 12.5e9}
    pred = []
    print(f"\nPredicted DDP gradient all-reduce of the benchmark MLP ({params:,} parameters, fp32: "
          f"{grad_bytes / 1e6:.2f} MB) across N nodes, one rank each; compute {compute_ms:.2f} ms per step "
          f"(1 rank, measured); alpha {gloo['alpha_us']:.0f} us (Gloo, measured):\n")
    print("| link | N | all-reduce ms | efficiency, no overlap | efficiency, full overlap |\n|---|---:|---:|---:|---:|")
    for name, bw in links.items():
        for n in (2, 4, 8, 16, 64):
            t = (alpha + FACTOR["all_reduce"](n) * grad_bytes / bw) * 1e3
            no_overlap = compute_ms / (compute_ms + t)
            full_overlap = compute_ms / max(compute_ms, t)
            pred.append({"link": name, "link_gbps": bw / 1e9, "nodes": n, "all_reduce_ms": round(t, 2),
                         "efficiency_no_overlap": round(no_overlap, 3), "efficiency_full_overlap": round(full_overlap, 3)})
            print(f"| {name} | {n} | {t:.2f} | {100 * no_overlap:.0f}% | {100 * full_overlap:.0f}% |")
    out["ddp_prediction"] = {"parameters": params, "gradient_bytes": grad_bytes, "compute_ms": compute_ms,
                             "alpha_us": gloo["alpha_us"], "rows": pred}
    if args.check:
        if load(args.json) != json.loads(json.dumps(out)):
            fail(f"{args.json} differs from what {args.comm} and {args.strategies} give: run bench/cost_model.py, "
                 "then bench/docs_tables.py --write")
        print(f"\n{args.json} matches its inputs")
        return
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
