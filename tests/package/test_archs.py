"""The package's check of the GPUs present against the archs a build has (torch-ext/.../_archs.py):
SASS runs on its own major and a later minor, PTX on any later GPU; elsewhere the message names the
build's archs and how to build for the GPU."""

import importlib.util

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("archs", ROOT / "torch-ext" / "transformer_kernels" / "_archs.py")
archs_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(archs_module)

RELEASE = ["10.0", "12.0+PTX", "7.5", "8.0", "8.6", "9.0"]  # an all-arch build's metadata.json


@pytest.mark.parametrize("capability,runs", [
    ((7, 5), True), ((8, 0), True), ((8, 6), True), ((8, 9), True),  # the L4 and RTX 40 run the 8.6 SASS
    ((9, 0), True), ((10, 0), True), ((12, 0), True), ((12, 1), True), ((13, 0), True),  # later GPUs: the PTX
    ((7, 0), False), ((6, 1), False), ((11, 0), False),  # V100, Pascal; 11.0 has neither SASS nor earlier PTX of 12.0
])
def test_release_build_runs_where_its_sass_or_ptx_does(capability, runs):
    assert archs_module.runs_on(RELEASE, capability) is runs


def test_a_one_arch_build_names_its_archs_on_another_gpu():
    assert archs_module.unsupported_device_message(["9.0+PTX"], "NVIDIA H200", (9, 0)) is None
    message = archs_module.unsupported_device_message(["9.0+PTX"], "NVIDIA A100", (8, 0))
    assert "NVIDIA A100 (compute capability 8.0)" in message and "built for 9.0+PTX" in message
    assert "--archs native" in message
