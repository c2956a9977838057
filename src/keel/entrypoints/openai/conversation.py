"""A conversation with tools, whatever API it came through (chat completions, responses, messages): rendered with
the chat template in a worker, and its tools planned (`ToolPlan`: which parser reads the output, which constraint
the grammar engine enforces). Each route converts its request into a `Conversation`, calls `prepare`, and hands the
prompt and constraints to `OpenAIServing.generate` in its `EngineRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keel.entrypoints.openai.chat_utils import ChatInputError, chat_job
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.tool_parsers import ToolPlan, ToolPlanError, plan_tools

if TYPE_CHECKING:
    from keel.entrypoints.openai.serving_engine import OpenAIServing


@dataclass(slots=True)
class Conversation:
    """Messages as chat templates read them, and the tools the model may call."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)  # {"type": "function", "function": {name, ...}}
    tool_choice: str | None = None  # none | auto | required | named; None: auto when there are tools
    function: str | None = None  # the function a named tool_choice forces
    parallel_tool_calls: bool = True
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None  # the request's own (only with --trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


@dataclass(slots=True)
class Prepared:
    """A rendered conversation: the prompt, how its output is read, the constraints its tools set."""

    prompt: str
    plan: ToolPlan
    constraints: list[tuple[str, dict[str, Any]]]

    def sampling(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The route's sampling fields, with the special tokens kept where the tool-call format is made of them."""
        return {**fields, "skip_special_tokens": False} if self.plan.keeps_special_tokens else fields


async def prepare(serving: OpenAIServing, conv: Conversation) -> Prepared:
    """Plan the tools and render the conversation (a 400 naming the field for a client mistake)."""
    serving.check_chat_template(conv.chat_template)
    template = conv.chat_template or serving.tokenizer.chat_template
    specs = [t["function"] for t in conv.tools]
    try:
        plan, constraints = plan_tools(
            [{"name": f["name"], "parameters": f.get("parameters")} for f in specs],
            conv.tool_choice,
            conv.function,
            parser=serving.config.tool_call_parser,
            template=template,
            parallel=conv.parallel_tool_calls,
        )
    except ToolPlanError as exc:
        raise bad_request(str(exc), "tool_choice") from exc
    try:
        job = chat_job(
            serving.tokenizer,
            conv.messages,
            tools=conv.tools or None,
            documents=conv.documents,
            add_generation_prompt=conv.add_generation_prompt,
            continue_final_message=conv.continue_final_message,
            chat_template=conv.chat_template,
            chat_template_kwargs=conv.chat_template_kwargs,
        )
    except ChatInputError as exc:
        raise bad_request(str(exc), exc.field) from exc
    except ValueError as exc:  # no chat template, or the request's template fields disagree
        raise bad_request(f"cannot apply the chat template: {exc}", "messages") from exc
    return Prepared(await serving.render_template(job), plan, constraints)
