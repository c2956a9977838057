"""Structured outputs through llguidance: a request's grammar (JSON schema, regex, choice, Lark) compiled
once per spec into a matcher template, a per-request copy advanced with each accepted token, and the whole
batch's allowed-token bitmask filled in one call for the sampler."""

from keel.structured.compile_job import grammar_text
from keel.structured.grammar import GrammarCompiler

__all__ = ["GrammarCompiler", "grammar_text"]
