"""Bugs found while building the serving soak (benchmarks/soak/serve.py checks each of them too), one test each."""

from __future__ import annotations

import openai
import pytest
from support.serve import MODEL_NAME, needs_ops, start_server

pytestmark = needs_ops


def test_more_choices_than_the_server_admits_is_400_not_503(tiny_model):
    """n (x prompts) beyond --max-num-seqs + --max-waiting can never be admitted: a 400 naming `n`, not a
    503 "retry later" that a retrying client would obey forever (the server was idle here)."""
    from keel.entrypoints.openai.server_config import ServerConfig

    served = start_server(tiny_model, engine_kwargs={"max_num_seqs": 2}, limits=ServerConfig(max_waiting=1))
    try:
        client = served.client()
        kw = dict(model=MODEL_NAME, max_tokens=2, temperature=0)
        for prompt, n in (("hi", 4), (["hi", "ho"], 2)):
            with pytest.raises(openai.BadRequestError) as info:
                client.completions.create(prompt=prompt, n=n, **kw)
            err = info.value.body
            assert isinstance(err, dict) and err["param"] == "n", err
            assert "admits at most 3 at once" in err["message"] and "4 sequences" in err["message"], err
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], n=4, **kw)
        assert len(client.completions.create(prompt="hi", n=3, **kw).choices) == 3  # at the bound: admitted
        assert served.metrics()["keel_request_rejected_total"] == 0  # none of them counted as overload
        served.wait_idle()
    finally:
        served.stop()
