# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options every module that asks the OpenAI-compatible endpoint shares.

They document ``vllm_client.ENDPOINT_OPTIONS``, the one argument spec of those options."""

from __future__ import annotations


class ModuleDocFragment:
    # The server's address and key: every module that asks the endpoint (vllm_soak takes only
    # these, as dgx_spark.cluster.vllm_endpoint.address).
    ADDRESS = r"""
options:
  url:
    description: Base URL of the OpenAI-compatible server, without C(/v1), as the node reaches it.
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description:
      - The server's API key (C(vllm_serve_api_key)), sent as a bearer token; empty sends none.
    type: str
    default: ""
"""

    # The rest of what vllm_endpoint and vllm_endpoint_info share, beside ADDRESS.
    DOCUMENTATION = r"""
options:
  model:
    description:
      - Served model name to ask for the completion.
      - M(dgx_spark.cluster.vllm_endpoint) requires it with O(completion);
        M(dgx_spark.cluster.vllm_endpoint_info) takes the first model of C(/v1/models) without it.
    type: str
  completion:
    description: Require a completion as well as C(/health).
    type: bool
    default: true
  prompt:
    description: Prompt of the completion.
    type: str
    default: Hello
  max_tokens:
    description:
      - Tokens asked of the completion, greedily. An answer with at least one proves that the
        ranks compute.
    type: int
    default: 1
  request_timeout:
    description:
      - Seconds one completion request may take.
      - M(dgx_spark.cluster.vllm_endpoint_info) gives each of its requests (health, models, the
        completion, each scrape) as long.
    type: int
    default: 60
"""
