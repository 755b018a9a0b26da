"""A front for OpenAI-compatible servers that are replaced while traffic flows.

:mod:`serving.gateway.vllm_process` runs one ``vllm serve`` process (vLLM's own OpenAI
server, in vLLM's environment); :mod:`serving.gateway.front` is the small HTTP front that
clients call, which moves traffic from one such server to the next without dropping a
request (what it captures of each: :mod:`serving.gateway.capture`);
:mod:`serving.gateway.scrape` reads vLLM's speculative-decoding counters from its
``/metrics``. :mod:`tasks.loop.vllm_deploy` ties them to the registry's champion alias.
"""
