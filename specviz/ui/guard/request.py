"""One run's settings, checked once where the request enters and then carried as one object.

``RunRequest.checked`` takes the page's controls (or the JSON API's arguments) in the order of the
/generate endpoint, validates every one of them (``specviz.ui.guard.checks``) and returns a frozen,
picklable object: on ZeroGPU it crosses into the GPU worker as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz import Sampling
from specviz.serving.gpu_duration import generate_duration
from specviz.ui.guard.checks import check_controls, check_drafting, check_pair_kind, mistake
from specviz.ui.guard.limits import CALIBRATION_SECONDS_MAX
from specviz.ui.tabs.tree import AUTO, check_tree, tree_spec

# The fields that are text, and how each is named in a message.
_TEXT_FIELDS = {
    "pair_name": "pair",
    "custom_drafter": "custom drafter",
    "custom_target": "custom target",
    "tree": "token tree",
}
# Their length at most: a hub id is at most 96 characters ("owner/name"), the menus' choices shorter.
TEXT_FIELD_MAX_CHARS = 200


def check_types(**fields) -> None:
    """Refuse a field of the wrong type (a list or a dict where text is expected, anything but true or
    false for chat) or text longer than TEXT_FIELD_MAX_CHARS, with a message naming the field, never
    repeating the value sent.

    Raises:
        gr.Error: the first field of the wrong type.
    """
    for key, value in fields.items():
        if key == "chat":
            if not isinstance(value, bool):
                raise mistake("chat must be true or false.", title="Invalid chat")
        elif key in _TEXT_FIELDS and not (isinstance(value, str) or (value is None and key.startswith("custom_"))):
            name = _TEXT_FIELDS[key]
            raise mistake(f"{name} must be text (one of the page's choices).", title=f"Invalid {name}")
        elif key in _TEXT_FIELDS and value is not None and len(value) > TEXT_FIELD_MAX_CHARS:
            name = _TEXT_FIELDS[key]
            raise mistake(
                f"{name} must be at most {TEXT_FIELD_MAX_CHARS} characters (one of the page's choices, or a hub id).",
                title=f"Invalid {name}",
            )


@dataclass(frozen=True)
class RunRequest:
    """A checked run: the pair (a preset name, or custom drafter and target ids), the prompt and its
    chat flag, gamma and its schedule, the drafter kind, the sampling settings (repetition penalty
    included), max new tokens and the seed."""

    pair_name: str
    prompt: str
    gamma: int
    sampling: Sampling
    max_new_tokens: int
    seed: int
    chat: bool = True
    custom_drafter: str = ""
    custom_target: str = ""
    drafter_kind: str = "model"
    gamma_schedule: str = "constant"
    tree: str = "chain"

    @classmethod
    def checked(
        cls,
        pair_name,
        prompt,
        gamma,
        temperature,
        top_k,
        top_p,
        max_new_tokens,
        seed,
        chat=True,
        custom_drafter="",
        custom_target="",
        drafter_kind="model",
        gamma_schedule="constant",
        repetition_penalty=1.0,
        tree="chain",
    ) -> "RunRequest":
        """Validate the controls, in the /generate endpoint's order, and the drafter kind against the
        pair's catalogue entry (``check_pair_kind``): nothing is loaded for a request refused here.

        Raises:
            gr.Error: naming the first bad field and its allowed range; a drafter kind the pair does not
                draft with, naming both and the kinds the pair allows.
        """
        check_types(
            pair_name=pair_name, chat=chat, custom_drafter=custom_drafter, custom_target=custom_target, tree=tree
        )
        sampling = check_controls(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, repetition_penalty)
        drafter_kind, gamma_schedule = check_drafting(drafter_kind, gamma_schedule)
        check_pair_kind(pair_name, drafter_kind, custom_drafter, custom_target)
        tree = check_tree(tree)
        return cls(
            tree=tree,
            pair_name=pair_name,
            prompt=prompt,
            gamma=int(gamma),
            sampling=sampling,
            max_new_tokens=int(max_new_tokens),
            seed=int(seed),
            chat=bool(chat),
            custom_drafter=custom_drafter or "",
            custom_target=custom_target or "",
            drafter_kind=drafter_kind,
            gamma_schedule=gamma_schedule,
        )

    @property
    def tree_spec(self):
        """The checked token tree as a TreeSpec, or None for a chain."""
        return tree_spec(self.tree)

    @property
    def sized_pair(self) -> tuple[str, str, str]:
        """(pair name, custom drafter, custom target): what prices the job's steps
        (``specviz.ui.running.share.sized``)."""
        return self.pair_name, self.custom_drafter, self.custom_target

    def duration(self, runs: int = 1) -> float:
        """ZeroGPU seconds for ``runs`` speculative runs, each with its baseline (``specviz.serving.gpu_duration``),
        and for the auto tree the cap of the calibration that may come first (``specviz.ui.tabs.tree.resolve``)."""
        s = self.sampling
        return runs * generate_duration(
            self.pair_name,
            None,
            self.gamma,
            s.temperature,
            s.top_k,
            s.top_p,
            self.max_new_tokens,
            self.seed,
            self.chat,
            self.custom_drafter,
            self.custom_target,
        ) + (CALIBRATION_SECONDS_MAX if self.tree == AUTO else 0)
