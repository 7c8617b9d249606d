# Copyright: dynatrain.elastic contributors
# Apache License 2.0 (see LICENSE)
"""launch_error: the EC2 error of a failed launch request, as {code, text}."""

from __future__ import annotations


def launch_error(result):
    """A failed amazon.aws module result -> {'code': EC2 error code or '', 'text': 'CODE: message'}.

    amazon.aws puts botocore's error under ``error`` (``code``, ``message``); a
    failure without one (a bad parameter, a timeout) keeps its ``msg``.
    """
    result = result if isinstance(result, dict) else {}
    error = result.get("error") if isinstance(result.get("error"), dict) else {}
    code = str(error.get("code") or "")
    message = str(error.get("message") or "").strip()
    if code and message:
        text = "%s: %s" % (code, message)
    else:
        text = str(result.get("msg") or code or "unknown error")
    return {"code": code, "text": text}


class FilterModule:
    def filters(self):
        return {"launch_error": launch_error}
