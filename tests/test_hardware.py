"""Which CPUs compute bf16 in hardware: a `bf16` setting computes in fp32 on a CPU without AVX-512 BF16 or AMX
(there torch emulates bf16, many times slower than fp32). The Triton backend holds its own copy of the check
(it imports nothing from pipelines): both are run here on the same cpuinfo."""

from __future__ import annotations

import ast
import io
import platform
from pathlib import Path

import pytest

from pipelines.hardware import cpu_has_bf16

ROOT = Path(__file__).resolve().parents[1]
AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\nmodel name\t: AMD EPYC avx512_bf16-like name\n"


def _backend_check(cpuinfo: str) -> bool:
    """The Triton backend's `_cpu_has_bf16`, run with /proc/cpuinfo reading `cpuinfo`."""
    tree = ast.parse((ROOT / "pipelines" / "triton_backend" / "model.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_cpu_has_bf16")
    namespace: dict = {"open": lambda *a, **k: io.StringIO(cpuinfo)}
    exec(compile(ast.Module([node], []), "model.py", "exec"), namespace)  # noqa: S102 (the repository's own code)
    return namespace["_cpu_has_bf16"]()


@pytest.mark.parametrize(("cpuinfo", "expected"), [(AMX, True), (AVX2, False), ("", False)])
def test_bf16_only_where_the_cpu_has_bf16_units(cpuinfo: str, expected: bool) -> None:
    assert cpu_has_bf16(cpuinfo) is expected
    assert _backend_check(cpuinfo) is expected  # the serving copy decides the same


def test_a_precision_comparison_without_bf16_units_is_refused_and_fp32_alone_is_not(monkeypatch) -> None:
    """Mutation tried: `bf16_comparison_problem` always None (the comparison would time fp32 as bf16): it fails."""
    from pipelines import hardware

    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda cpuinfo=None: False)
    assert "no bf16 units" in (hardware.bf16_comparison_problem(["fp32", "bf16", "auto"]) or "")
    assert hardware.bf16_comparison_problem(["fp32"]) is None
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda cpuinfo=None: True)
    assert hardware.bf16_comparison_problem(["fp32", "bf16"]) is None


def test_the_freed_heap_goes_back_where_there_is_glibc_and_nothing_breaks_where_there_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`release_freed_memory` (after each preference-training step): glibc's malloc_trim here; a C library without
    it (musl, macOS) or no loadable library at all is a quiet False, never an error."""
    import ctypes

    from pipelines import hardware

    hardware._malloc_trim.cache_clear()
    assert hardware.release_freed_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")

    class NoTrim:
        pass

    for broken in (lambda _: NoTrim(), lambda _: (_ for _ in ()).throw(OSError("no libc"))):
        hardware._malloc_trim.cache_clear()
        monkeypatch.setattr(ctypes, "CDLL", broken)
        assert hardware.release_freed_memory() is False
    hardware._malloc_trim.cache_clear()
