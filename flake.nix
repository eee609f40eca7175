{
  description = "Flake for transformer-kernels (the official kernel-builder build for the Kernel Hub)";

  # Pinned to a kernel-builder revision (huggingface/kernels, 2026-08-20, "Add kernel resolver
  # infrastructure (#775)"), so the toolchain and torch builds do not move under us. At this
  # revision `nix run .#build-and-copy` builds these CUDA variants (nix-builder/versions.nix,
  # build-variants.json), x86_64-linux and aarch64-linux:
  #   torch 2.12 and 2.13, each with CUDA 12.6, 13.0 and 13.2
  #   (torch212-cxx11-cu126/cu130/cu132-x86_64-linux, torch213-cxx11-cu126/cu130/cu132-...)
  # Our CI (.ci/run) compiles torch 2.11 + CUDA 13.0 (requirements.txt, every arch; tested) and
  # torch 2.14.1 + CUDA 13.0 (sm_90 only, scripts/build_newest_torch.sh); neither is a variant of
  # this Nix build, which has not been run here (no Nix on the CI machine). Update the pin
  # deliberately: `nix flake lock --update-input kernel-builder` writes flake.lock.
  inputs = {
    kernel-builder.url = "github:huggingface/kernels/8ac69fc542a4306eade0759ef7c45b4f2ae57df0";
  };

  outputs =
    {
      self,
      kernel-builder,
    }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
