# What a hardened systemd unit needs to reach NVIDIA GPUs through CUDA (builtins only), shared by
# services.llama-cpp and services.vllm.
rec {
  # The device nodes CUDA opens.
  nvidiaDevices = [
    "char-nvidiactl"
    "char-nvidia-frontend" # /dev/nvidia0, /dev/nvidia1, ...
    "char-nvidia-uvm" # /dev/nvidia-uvm, /dev/nvidia-uvm-tools
    "char-nvidia-caps" # /dev/nvidia-caps/*
  ];

  # serviceConfig settings that keep the GPU reachable, with DeviceAllow= set to `devices`.
  gpuAccess = devices: {
    # PrivateDevices=true would give the unit a /dev without the NVIDIA nodes, so it stays
    # false and DeviceAllow= opens exactly those nodes (DevicePolicy=closed still allows
    # /dev/null, /dev/zero, /dev/urandom, ...).
    PrivateDevices = false;
    DevicePolicy = "closed";
    DeviceAllow = devices;
    # CUDA (and Triton) JIT-compile kernels for the card and map the result executable; the
    # driver also needs writable+executable mappings. MemoryDenyWriteExecute=true (nixpkgs'
    # usual setting) makes CUDA initialisation fail, so it is off.
    MemoryDenyWriteExecute = false;
    # The CUDA driver and NVML read /proc/driver/nvidia/*, and llama.cpp's `fit` reads
    # /proc/meminfo; ProcSubset=pid would hide both.
    ProcSubset = "all";
  };
}
