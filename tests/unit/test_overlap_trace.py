"""Overlap accounting on a synthetic Chrome trace with the structure torch.profiler exports."""

from telefuser.profiling.overlap import Interval, intersection_length, union, v_copy_overlap


def _x(name, cat, ts, dur, tid=1, corr=None):
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event


def test_union_and_intersection():
    a = [Interval(0, 10), Interval(5, 15), Interval(20, 30)]
    assert union(a) == [Interval(0, 15), Interval(20, 30)]
    assert intersection_length(a, [Interval(12, 22)]) == 3 + 2


def test_v_copy_overlap_follows_correlation_ids():
    events = [
        _x("ulysses.scatter.v", "user_annotation", 100, 20),
        _x("cudaMemcpy2DAsync", "cuda_runtime", 105, 2, corr=1),
        _x("cudaMemcpy2DAsync", "cuda_runtime", 110, 2, corr=2),
        _x("ulysses.qk_norm_rope", "user_annotation", 130, 30),
        _x("cudaLaunchKernel", "cuda_runtime", 135, 2, corr=3),
        _x("cuLaunchKernel", "cuda_driver", 150, 2, corr=4),  # a Triton kernel (compiled Q/K prep) launches so
        _x("cudaLaunchKernel", "cuda_runtime", 170, 2, corr=5),  # outside every range: not counted
        # GPU side: the two copies run 200-300 and 300-350; the Q/K kernels 250-280 and 320-400.
        _x("Memcpy PtoP", "gpu_memcpy", 200, 100, tid=7, corr=1),
        _x("Memcpy PtoP", "gpu_memcpy", 300, 50, tid=7, corr=2),
        _x("rms_norm_kernel", "kernel", 250, 30, tid=8, corr=3),
        _x("rope_kernel", "kernel", 320, 80, tid=8, corr=4),
        _x("other_kernel", "kernel", 200, 300, tid=8, corr=5),
    ]
    report = v_copy_overlap({"traceEvents": events})
    assert report.v_copy_us == 150
    assert report.qk_prep_us == 110
    assert report.overlap_us == 30 + 30
