"""Sim-only vLLM platform plugin: vLLM's CPU platform, able to run under vLLM's Ray executor.

vLLM's Ray executor asks the platform for the Ray resource that one rank occupies
(``ray_device_key``); the CPU platform has none, so the executor refuses CPU. This plugin
names "GPU" (the simulated nodes start Ray with ``--num-gpus 1``: one logical GPU per rank),
and keeps the CPU worker's shared-memory all-reduce to ranks of one host (see
communicator.py). It is installed only into the simulated pair's donor image, never into a
production image.

vLLM calls ``register`` through the ``vllm.platform_plugins`` entry point while it resolves
``current_platform``; it returns the class by name, so nothing of vLLM is imported here
(importing vLLM's platform or communicator modules at that moment is a circular import).
"""


def register() -> str:
    return "dgxsim_ray_cpu.platform.RayCpuPlatform"
