"""``mtkit serve``: translation over HTTP, on the runtime's engines (an optional extra: ``pip install 'mtkit[serve]'``).

* :mod:`mtkit.serve.models`: a served model (an engine, its language pair and target) and the
  confidence of a hypothesis;
* :mod:`mtkit.serve.batcher`: dynamic batching, decoding threads per model behind a bounded queue;
* :mod:`mtkit.serve.schemas`: the request and response bodies, and the checks every request passes;
* :mod:`mtkit.serve.libretranslate`: LibreTranslate's rules (where fields come from, its messages, the
  web page's settings, its Swagger document);
* :mod:`mtkit.serve.service`: the server's models, limits, keys, metrics and glossary;
* :mod:`mtkit.serve.app`: the HTTP app, one router per API (LibreTranslate's ``/translate``,
  ``/languages``, ``/detect``, ``/health``, ``/frontend/settings``, ``/spec``; mtkit's ``/v1/translate``,
  ``/v1/models``, ``/metrics``; a page at ``/``);
* :mod:`mtkit.serve.server`: uvicorn, with a graceful stop on SIGTERM / SIGINT that exits 0.

Nothing here imports torch: the CTranslate2 engine must run without it.
"""
