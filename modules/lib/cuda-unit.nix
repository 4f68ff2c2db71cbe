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
  # (`fit = on` would place a 27B model there without a word). The two causes a first rebuild
  # on a real box meets are told apart, each with its fix: the NVIDIA kernel module not loaded
  # (the machine still runs the kernel it booted before the driver was enabled: reboot once),
  # and no libcuda.so.1 under /run/opengl-driver/lib (`hardware.graphics.enable` off).
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
    ${causes}
    exit 1
  '';

  # The causes the start checks name (bash, after their own message; shared with vLLM's).
  causes = ''
    if [[ ! -e /proc/driver/nvidia/version ]]; then
      echo "Cause: the NVIDIA kernel module is not loaded (/proc/driver/nvidia/version is missing). Right after the driver is first enabled the machine still runs the kernel it booted without it: ${rebootOnce}" >&2
    fi
    if [[ ! -e /run/opengl-driver/lib/libcuda.so.1 ]]; then
      echo "Cause: /run/opengl-driver/lib/libcuda.so.1 is missing, so CUDA cannot reach the driver: set hardware.graphics.enable = true (a headless machine too; nixpkgs' NVIDIA module does not set it)." >&2
    fi
    echo "Fix: ${rebootOnce} Check that hardware.graphics.enable is true, that nvidia-smi sees the GPU, that /dev/nvidia-uvm exists (the nvidia_uvm kernel module) and that the unit may open the NVIDIA devices (deviceAllow); for a CPU-only machine set services.llama-cpp.cuda = false (llmBench.cuda = false)." >&2
  '';

  # What every text about a first start says.
  # No backquotes: the start check echoes it inside double quotes.
  rebootOnce = "reboot once after first enabling the NVIDIA driver (nixos-rebuild switch does not load its kernel module into the running kernel), then run systemctl reset-failed on the unit if it hit its start limit.";

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
    + "driver; or `hardware.nvidia.datacenter.enable = true;` for data-centre GPUs), "
    + "`hardware.nvidia.open` for your card, and keep `hardware.graphics.enable = true` (set by "
    + "default with a CUDA engine: it puts libcuda.so.1 in /run/opengl-driver/lib); then "
    + rebootOnce
    + " Without the driver llama.cpp finds no GPU and runs every model on the CPU.";

  # The message of the assertion that the system installs the driver's user-space libraries
  # (`hardware.graphics.enable`): nixpkgs' NVIDIA module does not turn it on, and without it
  # libcuda.so.1 never reaches /run/opengl-driver/lib, where CUDA programs look for it.
  graphicsMessage =
    who:
    "${who}: a CUDA build needs `hardware.graphics.enable = true` (it installs the NVIDIA "
    + "driver's libcuda.so.1 in /run/opengl-driver/lib, where CUDA looks for it; nixpkgs' NVIDIA "
    + "module does not set it, and a headless machine needs it too). This module sets it by "
    + "default; a definition of false overrides that. Then "
    + rebootOnce;
}
