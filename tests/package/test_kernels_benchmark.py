"""benchmarks/benchmark*.py in the form `kernels benchmark <repo>` runs: found and parsed by kernels'
own discovery (no GPU needed), every workload verified against its eager reference, every op
family covered; on a GPU kernels' runner times them."""

import pytest

from conftest import ROOT

cli = pytest.importorskip("kernels.cli.benchmark")

FAMILIES = {"NormBenchmark", "ActivationBenchmark", "RopeBenchmark", "ModulationBenchmark"}


def discovered():
    scripts = cli.discover_benchmark_scripts("transformer-kernels", ROOT)
    return scripts, {cls.__name__: cls for script in scripts for cls in cli.discover_benchmark_classes(script, ROOT)}


def workloads(cls):
    return sorted(name.removeprefix("benchmark_") for name in dir(cls) if name.startswith("benchmark_"))


def test_kernels_benchmark_finds_our_scripts_and_workloads(capsys):
    scripts, classes = discovered()
    assert [s.name for s in scripts] == ["benchmark.py"]  # kernel-builder's card links benchmark.py
    assert set(classes) == FAMILIES
    for name, cls in classes.items():
        assert workloads(cls), name
        missing = [w for w in workloads(cls) if not hasattr(cls, f"verify_{w}")]
        assert not missing, f"{name}: workloads without an eager reference: {missing}"
    with capsys.disabled():
        print("\n" + "\n".join(f"  {name}: {', '.join(workloads(cls))}" for name, cls in sorted(classes.items())))


@pytest.mark.gpu
def test_kernels_benchmark_runner_times_and_verifies_every_workload():
    """kernels' own runner on this checkout's build (what `kernels benchmark ./` runs), a few
    iterations: every workload passes its verification."""
    _, classes = discovered()
    for cls in classes.values():
        results, _ = cli.run_benchmark_class(cls, iterations=3, warmup=1, repo_id=str(ROOT), is_local=True,
                                             revision="local")
        assert set(results) == set(workloads(cls)) and all(r.verified for r in results.values()), results
