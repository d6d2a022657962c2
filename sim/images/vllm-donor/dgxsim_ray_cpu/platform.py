"""The CPU platform with a Ray resource per rank and a host-scoped device communicator."""

import torch
from vllm.platforms.cpu import CpuPlatform

# vLLM's AMX kernels run in OpenMP threads that Linux lets use AMX tiles only after the
# process asked for them (arch_prctl ARCH_REQ_XCOMP_PERM). vLLM's own worker processes do;
# a Ray actor process never did, and its first bf16 attention died with SIGILL on the pair.
# Every process that resolves this platform asks, once, where the CPU has AMX.
if torch.cpu._is_amx_tile_supported():
    torch.cpu._init_amx()


class RayCpuPlatform(CpuPlatform):
    # Ray places one rank per logical GPU (ray start --num-gpus 1 on every simulated node).
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # By name, resolved when the first group is made (not while the platform resolves).
        return "dgxsim_ray_cpu.communicator.HostScopedCpuCommunicator"
