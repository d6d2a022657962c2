"""vLLM's CPU communicator, with shared memory only among ranks of one host.

The CPU worker names its shared-memory all-reduce group after the rendezvous port alone, so
ranks on two hosts agree on one name and each tries to open the other's segment ("open shm
in SHMManager failed"). Here a group whose ranks are on different hosts reports that they do
not share a group name, and vLLM falls back to torch.distributed (gloo), as it logs.
"""

import os
import socket

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


def _host_identity() -> str:
    # The fast-link address host_prep puts in the environment; the host name otherwise.
    return os.environ.get("VLLM_HOST_IP") or socket.gethostname()


class HostScopedCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        hosts: list[str] = [""] * self.world_size
        torch.distributed.all_gather_object(hosts, _host_identity(), group=self.device_group)
        if len(set(hosts)) > 1:
            return False
        return super()._all_group_ranks_share_shm_group_name()
