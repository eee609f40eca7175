"""The build as the Kernel Hub sees it; runs without a GPU.

Loading through get_local_kernel and LOCAL_KERNELS, the hashed op namespace, metadata.json,
fake impls on meta/fake tensors, the CPU rejection, the Python ABI of the .so and the archs it
carries."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ID, ROOT

OPS_NAME_RE = re.compile(r"^_transformer_kernels_cuda_([0-9a-f]{7}(_dirty)?|[a-z2-7]{13})$")


def test_variant_dir_name_matches_installed_torch(variant_dir):
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda = torch.version.cuda.replace(".", "")
    assert variant_dir.name == f"torch{major}{minor}-cxx11-cu{cuda}-x86_64-linux"


def test_variant_layout_is_flat(variant_dir):
    names = {p.name for p in variant_dir.iterdir()}
    assert {"__init__.py", "_ops.py", "layers.py", "metadata.json"} <= names
    assert len(list(variant_dir.glob("_transformer_kernels_cuda_*.abi3.so"))) == 1


def test_metadata_parses_with_kernels_and_names_the_namespace(variant_dir):
    from kernels._rust import Metadata

    meta = Metadata.read_from_file(str(variant_dir / "metadata.json"))
    raw = json.loads((variant_dir / "metadata.json").read_text())
    assert str(meta.name) == "transformer-kernels" and meta.version == 1 and meta.license == "Apache-2.0"
    assert OPS_NAME_RE.match(meta.id), meta.id
    assert (variant_dir / f"{meta.id}.abi3.so").exists()
    assert raw["backend"]["type"] == "cuda" and raw["backend"]["archs"]
    # as kernel-builder writes them: the newest arch (the one with PTX) marked +PTX, a digest of
    # every file of the variant, the provenance of the build
    assert sum(a.endswith("+PTX") for a in raw["backend"]["archs"]) == 1
    files = {p.relative_to(variant_dir).as_posix() for p in variant_dir.rglob("*") if p.is_file()
             and "__pycache__" not in p.parts and p.name != "metadata.json"}
    assert raw["digest"]["algorithm"] == "sha256" and set(raw["digest"]["files"]) == files
    assert raw["provenance"]["kernel-builder"]["version"] and "commit" in raw["provenance"]["kernel"]


def test_namespace_carries_git_tree_id(variant_dir):
    meta = json.loads((variant_dir / "metadata.json").read_text())
    git = shutil.which("git") and subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD^{tree}"],
                                                 capture_output=True, text=True)
    if not git or git.returncode != 0:
        pytest.skip("not a git checkout: the id is random, as kernel-builder does outside git")
    tree = git.stdout.strip()
    assert meta["id"].startswith(f"_transformer_kernels_cuda_{tree[:7]}"), (
        f"{meta['id']} was built from another tree than HEAD ({tree[:7]}); rebuild")


def test_loads_through_get_local_kernel_and_local_kernels(tk, variant_dir):
    import kernels

    local = kernels.get_local_kernel(ROOT / "build")
    assert local is tk, "get_kernel(LOCAL_KERNELS) and get_local_kernel must load the same module"
    meta = json.loads((variant_dir / "metadata.json").read_text())
    assert tk.__name__ == meta["id"]
    for op in ("rms_norm", "rms_norm_out", "fused_add_rms_norm", "fused_add_rms_norm_out", "fused_add_rms_norm_",
               "layer_norm", "layer_norm_out", "norm_modulate", "norm_modulate_out", "gated_add_norm_modulate",
               "gated_add_norm_modulate_out", "activation", "activation_out", "act_and_mul", "act_and_mul_out",
               "act_mul", "act_mul_out", "gated_add", "gated_add_out", "rope", "rope_", "rope_cached_", "qk_norm_rope",
               "hf_qk_norm_rope", "hf_qk_norm_rope_out", "ltx_rope_from_coords", "ltx_qk_norm_rope_from_coords",
               "linear_gelu", "linear_gelu_out", "linear_gelu_fused"):
        assert hasattr(getattr(torch.ops, meta["id"]), op)
    assert tk.add_op_namespace_prefix("rms_norm") == f"{meta['id']}::rms_norm"
    assert set(tk.__all__) >= {"rms_norm", "layers"} and not {"ops", "add_op_namespace_prefix"} & set(tk.__all__)
    assert tk.ops is not None and callable(tk.add_op_namespace_prefix)  # importable plumbing, not public API


@pytest.mark.parametrize("rounding", ["hf", "diffusers", "torch"])
@pytest.mark.parametrize("wdtype", [None, torch.bfloat16, torch.float32])
def test_fake_impl_on_meta_and_fake_tensors(tk, rounding, wdtype):
    x = torch.empty(3, 5, 4096, device="meta", dtype=torch.bfloat16)
    w = None if wdtype is None else torch.empty(4096, device="meta", dtype=wdtype)
    out = tk.rms_norm(x, w, 1e-6, rounding=rounding)
    assert out.device.type == "meta" and out.shape == x.shape
    expected_dtype = torch.bfloat16 if (wdtype is None or rounding == "torch") else wdtype
    assert out.dtype == expected_dtype
    with FakeTensorMode():
        xf = torch.empty(7, 128, dtype=torch.float16)
        assert tk.rms_norm(xf, None, 1e-5, rounding=rounding).shape == (7, 128)


def test_every_op_traces_on_meta(tk):
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, r, w = torch.empty(2, 9, 256, **meta), torch.empty(2, 9, 256, **meta), torch.empty(256, **meta)
    s = torch.empty(2, 1, 256, **meta)
    out, h = tk.fused_add_rms_norm(x, r, w)
    assert out.shape == h.shape == x.shape and out.dtype == h.dtype == torch.bfloat16
    out, h = tk.fused_add_rms_norm(x, r, w.float())
    assert out.dtype == torch.float32 and h.dtype == torch.bfloat16
    assert tk.fused_add_rms_norm_(x, r, w)[0] is x
    assert tk.layer_norm(x, w, w).shape == x.shape
    assert tk.norm_modulate(x, s, s, norm="layer").shape == x.shape
    out, h = tk.gated_add_norm_modulate(x, r, s, s, s)
    assert h.shape == out.shape == x.shape
    with pytest.raises(Exception, match="norm must be"):
        tk.norm_modulate(x, s, s, norm="group")
    assert tk.silu(x).shape == x.shape and tk.gelu(x, "tanh").dtype == torch.bfloat16
    assert tk.silu_and_mul(x).shape == (2, 9, 128) and tk.geglu(x).shape == (2, 9, 128)
    assert tk.act_mul(x, r, "gelu").shape == x.shape and tk.gated_add(x, r, s).shape == x.shape
    with pytest.raises(Exception, match="last dimension must be even"):
        tk.silu_and_mul(torch.empty(3, 7, device="meta"))
    q, k = torch.empty(2, 8, 9, 128, **meta), torch.empty(2, 2, 9, 128, **meta)
    cos = torch.empty(2, 9, 128, **meta)
    q_out, k_out = tk.apply_rotary_pos_emb(q, k, cos, cos)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert tk.ltx_rope(x, r, x.float(), x.float())[0].shape == x.shape
    qt, kt = torch.empty(9, 8 * 128, **meta), torch.empty(9, 2 * 128, **meta)
    positions = torch.empty(9, device="meta", dtype=torch.long)
    assert tk.rotary_embedding(positions, qt, kt, 128, torch.empty(64, 128, **meta))[0] is qt
    assert tk.ltx_qk_norm_rope(x, r, w, w, 1e-6, x.float(), x.float())[1].shape == r.shape
    wd = torch.empty(128, **meta)
    q, k = torch.empty(2, 9, 8, 128, **meta), torch.empty(2, 9, 2, 128, **meta)  # Qwen3's [B, S, H, d]
    q_out, k_out = tk.hf_qk_norm_rope(q, k, wd, wd, 1e-6, cos, cos)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.is_contiguous()
    outs = (torch.empty(2, 9, 8, 128, **meta), torch.empty(2, 9, 2, 128, **meta))
    assert tk.hf_qk_norm_rope(q, k, wd, wd, 1e-6, cos, cos, out=outs) == outs
    with pytest.raises(Exception, match="k_out must have the shape"):
        tk.hf_qk_norm_rope(q, k, wd, wd, 1e-6, cos, cos, out=(outs[0], outs[0]))
    grid, freqs = torch.empty(1, 9, 3, device="meta"), torch.empty(256 // 6, device="meta")
    q_out, k_out = tk.ltx_rope_from_coords(x, r, grid, freqs)
    assert q_out.shape == k_out.shape == x.shape and q_out.dtype == torch.bfloat16
    q_out, k_out = tk.ltx_qk_norm_rope_from_coords(x, r, w, w, 1e-6, grid.expand(2, 9, 3), freqs)
    assert q_out.shape == k_out.shape == x.shape and k_out.dtype == torch.bfloat16
    codes, scale = tk.quantize_fp8(x)
    assert codes.shape == x.shape and codes.dtype == torch.float8_e4m3fn
    assert scale.shape == (2, 9, 1) and scale.dtype == torch.float32


def test_fake_impl_rejects_bad_out(tk):
    x = torch.empty(3, 64, device="meta", dtype=torch.bfloat16)
    with pytest.raises(Exception, match=r"out must have the shape \[3, 64\], got \[3, 63\]"):
        tk.ops.rms_norm_out(torch.empty(3, 63, device="meta", dtype=torch.bfloat16), x, None, 1e-6, "hf")


def test_cpu_tensors_rejected_with_clear_error(tk):
    with pytest.raises(ValueError, match="x must be a CUDA tensor, got a tensor on cpu"):
        tk.rms_norm(torch.randn(2, 64), torch.ones(64))
    with pytest.raises(ValueError, match="x must be a CUDA tensor, got a tensor on cpu"):
        tk.rms_norm(torch.randn(2, 64), torch.ones(64), out=torch.empty(2, 64))
    with pytest.raises(ValueError, match="act_mul: gate must be a CUDA tensor, got a tensor on cpu"):
        tk.act_mul(torch.randn(2, 64), torch.randn(2, 64))
    with pytest.raises(ValueError, match="ltx_rope_from_coords: q must be a CUDA tensor, got a tensor on cpu"):
        tk.ltx_rope_from_coords(torch.randn(1, 4, 64), torch.randn(1, 4, 64), torch.rand(1, 4, 3),
                                      torch.rand(10))
    with pytest.raises(ValueError, match="ltx_qk_norm_rope_from_coords: q must be a CUDA tensor"):
        tk.ltx_qk_norm_rope_from_coords(torch.randn(1, 4, 64), torch.randn(1, 4, 64), torch.ones(64), torch.ones(64),
                                        1e-6, torch.rand(1, 4, 3), torch.rand(10))


def test_layers_follow_hub_rules(tk):
    """The validation kernelize runs: no __init__, no extra members, the host's forward signature."""
    from kernels.layer.layer import _validate_layer

    _validate_layer(check_cls=torch.nn.RMSNorm, cls=tk.layers.RMSNorm, repo=REPO_ID)
    _validate_layer(check_cls=torch.nn.LayerNorm, cls=tk.layers.LayerNorm, repo=REPO_ID)
    assert tk.layers.RMSNorm.can_torch_compile and tk.layers.LayerNorm.can_torch_compile

    class HostActivation(torch.nn.Module):  # the forward signature of transformers' activations
        def forward(self, input):
            return input

    for name in ("Silu", "Gelu", "GeluTanh", "SiluAndMul", "GeluAndMul", "GeluTanhAndMul"):
        layer = getattr(tk.layers, name)
        _validate_layer(check_cls=HostActivation, cls=layer, repo=REPO_ID)
        assert layer.can_torch_compile


def test_python_abi3_compliance(variant_dir):
    from kernel_abi_check import ObjectFile

    so = next(variant_dir.glob("*.abi3.so"))
    obj = ObjectFile(str(so))
    assert obj.check_python_abi("3.9") == [], "the extension uses CPython symbols outside the 3.9 limited API"


def test_no_private_copy_of_the_cxx_runtime(variant_dir):
    """libstdc++ must come from the system (as torch's does): a statically linked copy has its own
    uninitialized locale and crashes on the first formatted error message."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) on PATH")
    so = next(variant_dir.glob("*.abi3.so"))
    symbols = subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    private = [line for line in symbols.splitlines() if re.search(r"\b_ZNSo9_M_insert|\b_ZNSt6locale", line)]
    assert not private, f"{so.name} defines libstdc++ internals: {private[:5]}"


def test_cublaslt_resolves_through_torch(variant_dir):
    """linear_gelu calls cuBLASLt, which the .so does not link (kernel-builder links torch and cudart
    only): its symbols are left undefined and resolve through libtorch_cuda, which links cuBLASLt."""
    nm, readelf = shutil.which("nm"), shutil.which("readelf")
    if nm is None or readelf is None:
        pytest.skip("no nm/readelf (binutils) on PATH")
    so = next(variant_dir.glob("*.abi3.so"))
    undefined = subprocess.run([nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True,
                               check=True).stdout
    assert "cublasLtMatmul" in undefined
    needed = subprocess.run([readelf, "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert "libtorch_cuda.so" in needed and "libcublasLt" not in needed
    torch_cuda = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if torch_cuda.exists():
        deps = subprocess.run([readelf, "-d", str(torch_cuda)], capture_output=True, text=True, check=True).stdout
        assert "libcublasLt" in deps, "the installed torch does not link cuBLASLt: linear_gelu would not load"


def test_manylinux_report(variant_dir, capsys):
    """Report only: manylinux_2_28 is guaranteed by kernel-builder's Nix toolchain, not by this build."""
    from kernel_abi_check import ObjectFile

    so = next(variant_dir.glob("*.abi3.so"))
    issues = ObjectFile(str(so)).check_manylinux("manylinux_2_28")
    with capsys.disabled():
        print(f"\n[manylinux_2_28] {so.name}: {len(issues)} symbol(s) above the policy"
              + "".join(f"\n  {i}" for i in issues[:5]))


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else None


def test_so_carries_machine_code_for_every_listed_arch(variant_dir):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump on PATH or in triton")
    so = next(variant_dir.glob("*.abi3.so"))
    listing = subprocess.run([tool, "--list-elf", str(so)], capture_output=True, text=True, check=True).stdout
    sass = sorted({m.group(1) for m in re.finditer(r"\.sm_(\d+)\.", listing)}, key=int)
    archs = json.loads((variant_dir / "metadata.json").read_text())["backend"]["archs"]
    listed = sorted((a.removesuffix("+PTX").replace(".", "") for a in archs), key=int)
    assert sass == listed, f"SASS {sass} vs metadata archs {archs}"


def test_a_gpu_without_code_is_named_with_the_build_s_archs(variant_dir):
    """check_launch (common/checks.h) turns CUDA's "no kernel image is available" into a message naming
    the GPU's compute capability and the archs the build was compiled for (nvcc's __CUDA_ARCH_LIST__,
    compiled into the extension): the list it carries is metadata.json's."""
    meta = json.loads((variant_dir / "metadata.json").read_text())
    caps = sorted(tuple(map(int, a.split("+")[0].split("."))) for a in meta["backend"]["archs"])
    arch_list = ",".join(str(major * 100 + minor * 10) for major, minor in caps).encode()
    binary = next(variant_dir.glob("*.abi3.so")).read_bytes()
    assert b"this build has no code for the GPU in use" in binary
    assert arch_list + b"\0" in binary, f"the archs {arch_list!r} are not in the extension"


def sass_by_kernel(tool: str, so: Path, arch: str) -> dict[str, str]:
    """{mangled kernel name: its SASS} for one arch of the extension."""
    listing = subprocess.run([tool, "-sass", "-arch", arch, str(so)], capture_output=True, text=True, check=True).stdout
    parts = re.split(r"^\s*Function : (\S+)\s*$", listing, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


E4M3_INSTRUCTION = re.compile(r"\bF2FP\.\S*E4M3")


def test_ada_sass_converts_to_fp8_in_hardware(variant_dir):
    """8.9 has SASS of its own for its FP8 kernels: there quantize_fp8's conversions to e4m3 are
    instructions (F2FP ... E4M3), which sm_86 code, what an L4 or RTX 40 ran before, emulates."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump on PATH or in triton")
    archs = [a.removesuffix("+PTX") for a in json.loads((variant_dir / "metadata.json").read_text())["backend"]["archs"]]
    if "8.9" not in archs:
        pytest.skip(f"a build without 8.9 ({archs}); CI's build for every arch has it")
    so = next(variant_dir.glob("*.abi3.so"))
    ada = {k: v for k, v in sass_by_kernel(tool, so, "sm_89").items() if "quantize_fp8_body" in k}
    assert ada, "no quantize_fp8 kernel in the sm_89 code"
    assert all(E4M3_INSTRUCTION.search(sass) for sass in ada.values()), [k for k, v in ada.items()
                                                                          if not E4M3_INSTRUCTION.search(v)]
    if "8.6" in archs:
        ampere = {k: v for k, v in sass_by_kernel(tool, so, "sm_86").items() if k in ada}
        assert ampere.keys() == ada.keys() and not any(E4M3_INSTRUCTION.search(v) for v in ampere.values())
