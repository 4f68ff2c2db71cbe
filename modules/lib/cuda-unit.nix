# What a hardened systemd unit needs to reach NVIDIA GPUs through CUDA (builtins only), shared by
# services.llama-cpp and services.vllm.
rec {
  # The device classes CUDA opens, by the names the driver gives them in /proc/devices (systemd
  # resolves `char-NAME` there when the unit starts). Driver 550.40 renamed "nvidia-frontend"
  # to "nvidia" (the /dev/nvidiaN nodes) and "nvidiactl"; both spellings are listed so that
  # older and newer drivers work.
  nvidiaDevices = [
    "char-nvidiactl" # /dev/nvidiactl
    "char-nvidia" # /dev/nvidia0, /dev/nvidia1, ... (driver >= 550.40)
    "char-nvidia-frontend" # the same nodes, older drivers
    "char-nvidia-uvm" # /dev/nvidia-uvm, /dev/nvidia-uvm-tools
    "char-nvidia-caps" # /dev/nvidia-caps/*
  ];

  # The kernel module behind /dev/nvidia-uvm. CUDA needs it, the hardened unit cannot load it
  # (ProtectKernelModules), and systemd resolves `char-nvidia-uvm` only if it is loaded when
  # the unit starts, so it is loaded at boot.
  kernelModules = [ "nvidia_uvm" ];

  # The unit's ExecStartPre (a bash script's text, for `server`, a llama-server binary): it
  # fails, saying why, unless `llama-server --list-devices` lists a CUDA device. The check runs
  # inside the unit's own sandbox, so a missing driver, a missing /dev/nvidia-uvm or a device
  # the unit may not open all stop the service instead of letting llama.cpp start on the CPU
  # (`fit = on` would place a 27B model there without a word).
  requireCudaDevice = server: ''
    # `--list-devices` prints "Available devices:" and one "  CUDA0: NAME (... MiB, ...)" line
    # per device, or "  (none)".
    devices=$(${server} --list-devices 2>&1)
    status=$?
    if [[ $status -eq 0 && $devices =~ (^|$'\n')[[:space:]]*CUDA[0-9]+: ]]; then
      exit 0
    fi
    echo "llama-cpp: refusing to start: \`${server} --list-devices\` (exit status $status) shows no CUDA device, so every model would run on the CPU. It printed:" >&2
    printf '%s\n' "$devices" >&2
    echo "Fix: check that nvidia-smi sees the GPU, that /dev/nvidia-uvm exists (the nvidia_uvm kernel module) and that the unit may open the NVIDIA devices (services.llama-cpp.deviceAllow); for a CPU-only machine set services.llama-cpp.cuda = false (llmBench.cuda = false)." >&2
    exit 1
  '';

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

  # The message of the assertion that a NixOS system running a CUDA build has the NVIDIA
  # driver (`hardware.nvidia.enabled`, read only, is true once `services.xserver.videoDrivers`
  # names "nvidia" or `hardware.nvidia.datacenter.enable` is set).
  driverMessage =
    who:
    "${who}: a CUDA build needs the NVIDIA driver, and none is configured: set "
    + "`services.xserver.videoDrivers = [ \"nvidia\" ];` (a headless machine too: it selects the "
    + "driver; or `hardware.nvidia.datacenter.enable = true;` for data-centre GPUs) and "
    + "`hardware.nvidia.open` for your card; without it llama.cpp finds no GPU and runs every "
    + "model on the CPU.";
}
