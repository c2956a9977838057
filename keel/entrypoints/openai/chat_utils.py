"""Render a chat request with the model's jinja template: tools, tool results, documents, template kwargs.

`keel.hf.tokenizer.Tokenizer.apply_chat_template` renders plain messages; a server also passes the
request's `tools` (and vLLM's `documents`, `chat_template_kwargs`, a per-request `chat_template`),
assistant `tool_calls` with their arguments as objects (what HF templates index into), and supports
`continue_final_message` (the reply continues the last message instead of starting a new one).
Templates compile in the same sandbox as the tokenizer's (`keel.hf.tokenizer_files.compile_template`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})


@lru_cache(maxsize=8)
def _compiled(source: str) -> Any:
    from keel.hf.tokenizer_files import compile_template

    return compile_template(source, "chat_template")


def renders_tools(template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable (so tool_choice auto has something to act on)."""
    return template is not None and "tools" in template


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as HF templates read them: `developer` -> `system`, tool call arguments parsed to objects."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                c = dict(c)
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass  # a template that prints it gets the string
                c["function"] = fn
                fixed.append(c)
            m["tool_calls"] = fixed
        out.append(m)
    return out


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text of a chat request (ValueError: no template, or the template refuses the request)."""
    source = chat_template or tokenizer.chat_template
    if source is None:
        raise ValueError("this model has no chat template; send chat_template or use /v1/completions")
    kwargs = dict(chat_template_kwargs or {})
    clash = sorted(_RESERVED & kwargs.keys())
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)} (the request's own fields do)")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    msgs = template_messages(messages)
    if continue_final_message and (not msgs or msgs[-1].get("role") != "assistant"):
        raise ValueError("continue_final_message needs the last message to be the assistant's")
    text = _compiled(source).render(
        messages=msgs,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokenizer.bos_token or "",
        eos_token=tokenizer.eos_token or "",
        **kwargs,
    )
    if continue_final_message:  # cut what the template adds after the final message (its end-of-turn)
        final = msgs[-1].get("content") or ""
        if isinstance(final, list):
            final = "".join(p.get("text", "") for p in final)
        at = text.rfind(final) if final else -1
        if at >= 0:
            text = text[: at + len(final)]
    return str(text)
