"""The old import path of the rules for every ``generate()`` argument: they are refusals, so they live in
:mod:`hf_hetspec.checks` with every other refusal of a call (:func:`hf_hetspec.checks.check_generate_inputs`,
whose module docstring lists what is honoured and what is refused)."""

from .checks import (  # noqa: F401 -- the old import path
    CARRIED_MODEL_INPUTS,
    NO_EFFECT_KEYWORDS,
    OTHER_DECODING_METHODS,
    SETTING_RULES,
    SETTINGS_AMONG_MODEL_KWARGS,
    STATEFUL_PROCESSORS,
    SettingRule,
    check_generate_inputs,
)
