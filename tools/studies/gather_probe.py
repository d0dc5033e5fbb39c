"""Probe: the cheapest way to gather the columns of a small activation on a GPU.

The act_order MLPs of tensor parallelism gather x [M, K] by a permutation before the first
layer (``x.index_select(1, perm)``); the profiles of tools/bench_tp.py put that at 6.5-7 µs a
call at M = 1, a fifth of the kernel after it. This times the torch forms that compute the
same gather, each checked against ``index_select`` first, in CUDA graphs of many calls (as a
served model replays them): medians of repeats, microseconds per call.

    python tools/studies/gather_probe.py --k 8192,14336 --rows 1,4,16
"""

from __future__ import annotations

import argparse
import json
import statistics


def forms(x, index):
    """{name: callable() -> [M, K] gathered}: every form computes x[:, index]."""
    import torch

    rows = x.shape[0]
    expanded = index.unsqueeze(0).expand(rows, -1).contiguous()
    flat_index = (torch.arange(rows, device=x.device).unsqueeze(1) * x.shape[1]
                  + index.unsqueeze(0)).reshape(-1)
    found = {
        "index_select(1)": lambda: x.index_select(1, index),
        "x[:, index]": lambda: x[:, index],
        "gather(1)": lambda: torch.gather(x, 1, expanded),
        "take(flat)": lambda: x.reshape(-1).index_select(0, flat_index).view(rows, -1),
        "t().index_select(0).t()": lambda: x.t().index_select(0, index).t(),
    }
    return found


def time_form(run, calls: int, repeats: int) -> float:
    """Median microseconds per call of ``run`` over ``repeats`` replays of a graph of ``calls``."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="8192,14336")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gather_probe: needs a CUDA GPU")
        return 2
    results = []
    for k in (int(v) for v in args.k.split(",")):
        for rows in (int(v) for v in args.rows.split(",")):
            generator = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16, generator=generator)
            index = torch.randperm(k, device="cuda", generator=generator)
            expected = x.index_select(1, index)
            row = {"k": k, "rows": rows}
            for name, run in forms(x, index).items():
                if not torch.equal(run(), expected):
                    print(f"{name}: differs from index_select at K={k} M={rows}")
                    return 1
                row[name] = time_form(run, args.calls, args.repeats)
            results.append(row)
            print(f"K={k:6d} M={rows:3d} " + "  ".join(
                f"{name} {us:.2f}" for name, us in row.items() if name not in ("k", "rows")))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "us_per_call": results}, handle,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
