"""Recipes: how a new bridge starts and trains, as named objects that work with any pair.

A recipe is what a demo learned about making composition work, made reusable: the paper's plain bridge, or the
knowledge recipe the real-model preset was trained with. It sets the learning-rate scales of the bridge's parts
(TrainConfig fields), how the value path starts (at random, or as the map between the two models' output
vocabularies: vocab_init.py), whether rehearsal rows are added (general questions answered by the anchor itself,
trained toward its own next-token distributions: rehearsal.py), where attention starts (recency), and two data tricks:
each question asked in surface variants (question_variants.py) and asked about invented subjects (unknown_subjects.py). `prepare` applies the start to a fresh bridge and says
what it did, and what it could not do and what runs instead; its name is saved with the bridge (bridge_config.json)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

import torch

from ..errors import CALMError


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str  # one line: what it is for
    value_start: str = "random"  # "random", or "vocabulary": the map between the output vocabularies (vocab_init)
    answer_share: float = 0.7  # vocabulary start: the share of the map's fit weighted to the answers' tokens
    value_lr_scale: float = 1.0  # 0 keeps the value path as it started
    position_lr_scale: float = 1.0  # recency biases and null keys
    gate_lr_scale: float = 1.0
    rehearsal: int = 0  # general questions answered by the anchor itself, added when the data has no keep_anchor rows
    rehearsal_new_tokens: int = 40
    recency_start: float = 0.0  # > 0: attention starts on the augmenting model's newest token (its recency bias at
    #                             age 0), where an answer that restates the fact ("NAME was born in") has m_A about
    #                             to say it; 0 leaves the biases at zero
    question_variants: int = 0  # each question row also asked in this many surface variants (question_variants.py)
    unknown_subjects: int = 0  # the questions asked again about this many invented names (unknown_subjects.py)
    unknown_answer: str = ""  # their answer: "" the anchor's own (keep_anchor), else a sentence, {subject} the name

    def __post_init__(self):
        for name, high in (("question_variants", 8), ("unknown_subjects", 2000), ("rehearsal", 2000)):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value <= high:
                raise CALMError(f"recipe {self.name}: {name} must be a whole number from 0 to {high}, not {value!r}")

    def train_fields(self) -> dict:
        """The TrainConfig fields this recipe sets."""
        return {"value_lr_scale": self.value_lr_scale, "position_lr_scale": self.position_lr_scale,
                "gate_lr_scale": self.gate_lr_scale}

    def to_dict(self) -> dict:
        return asdict(self)


RECIPES = {
    "plain": Recipe("plain", "The paper's bridge: a random value path, every part at the same learning rate."),
    "knowledge": Recipe(
        "knowledge", "For facts only the augmenting model knows: the value path starts as the map between the two "
        "models' output vocabularies (weighted to the answers' tokens) and stays fixed, so it carries tokens the "
        "training data never shows; attention positions learn 25×, gates 5× faster; rehearsal rows keep the anchor "
        "elsewhere.", value_start="vocabulary", value_lr_scale=0.0, position_lr_scale=25.0, gate_lr_scale=5.0,
        rehearsal=96),
    "knowledge-sentence": Recipe(
        "knowledge-sentence", "The knowledge recipe for answers that restate the fact (\"NAME was born in TOWN.\"): "
        "attention also starts on the augmenting model's newest token (recency bias 4 there), where the answer has it "
        "about to say the fact; reads the fact in the question's own words less, so other wordings work better.",
        value_start="vocabulary", value_lr_scale=0.0, position_lr_scale=25.0, gate_lr_scale=5.0, rehearsal=96,
        recency_start=4.0),
    "knowledge-varied": Recipe(
        "knowledge-varied", "The knowledge-sentence recipe plus two data tricks from the real-model demo: every "
        "question also asked in 2 surface variants (an opener or closer, lower case, a typo, a second chat turn), "
        "for other wordings; and 100 questions about invented names answered as the anchor alone answers them, for "
        "subjects the augmenting model never read about. On the real pair at equal steps it did not beat "
        "knowledge-sentence (docs/training-recipes.md): give it more steps, and an augmenting model that knows "
        "what it does not know.",
        value_start="vocabulary", value_lr_scale=0.0, position_lr_scale=25.0, gate_lr_scale=5.0, rehearsal=96,
        recency_start=4.0, question_variants=2, unknown_subjects=100),
}
DEFAULT_RECIPE = "plain"


def get_recipe(recipe: str | dict | Recipe | None) -> Recipe:
    """A recipe by name (RECIPES), or from its saved dict (a bridge_config.json's "recipe")."""
    if isinstance(recipe, Recipe):
        return recipe
    if recipe is None:
        return RECIPES[DEFAULT_RECIPE]
    if isinstance(recipe, dict):
        known = {f.name for f in fields(Recipe)}
        unknown = sorted(set(recipe) - known)
        if unknown:
            raise CALMError(f"A recipe has unknown settings {', '.join(unknown)}; a recipe has {', '.join(sorted(known))}.")
        return Recipe(**recipe)
    if recipe not in RECIPES:
        raise CALMError(f"Unknown recipe {recipe!r}; the recipes are " + "; ".join(
            f"{r.name}: {r.summary}" for r in RECIPES.values()))
    return RECIPES[recipe]


def describe() -> str:
    """Every recipe, one line each (the CLI's --recipe help, the Train tab's menu)."""
    return "\n".join(f"{r.name}: {r.summary}" for r in RECIPES.values())


def is_new(calm) -> bool:
    """A bridge no recipe has started yet (not loaded, not trained): prepare() applies to it."""
    return getattr(calm, "recipe", None) is None


def prepare(calm, recipe: Recipe, examples: list, seed: int | None = None) -> tuple[dict, list, list[str]]:
    """Start a new bridge the recipe's way. Returns (TrainConfig fields to change from the recipe's, rehearsal
    examples to add to the training data, notes): where a step cannot apply (no shared tokens, no block that reads
    a final state), the value path starts at random and trains at the full learning rate instead, and a note says
    so. The recipe is recorded on the bridge (calm.recipe), and saved with it. `seed` (the run's): the bridge's
    initial weights are drawn from it first, so the app and the command line start a run from the same bridge."""
    changes, notes = {}, [f"recipe {recipe.name}"]
    if seed is not None and hasattr(calm, "reseed_bridge"):
        calm.reseed_bridge(seed)
    if recipe.value_start == "vocabulary":
        notes.append(_vocabulary_start(calm, recipe, examples, changes))
    if recipe.recency_start:
        notes.append(start_on_newest_token(calm, recipe.recency_start))
    extra = []
    if recipe.rehearsal:
        if any(e.keep_anchor for e in examples):
            notes.append(f"rehearsal: the data's own {sum(e.keep_anchor for e in examples):,} keep_anchor rows")
        else:
            from .rehearsal import rehearsal_examples

            extra = rehearsal_examples(calm, examples, recipe.rehearsal, recipe.rehearsal_new_tokens)
            notes.append(f"rehearsal: {len(extra)} general questions answered by the anchor itself, trained toward "
                         "its own next-token distributions")
    extra += _data_tricks(calm, recipe, examples, seed or 0, notes)
    calm.recipe = recipe.to_dict()
    return changes, extra, notes


def _data_tricks(calm, recipe: Recipe, examples: list, seed: int, notes: list[str]) -> list:
    """The rows the recipe's data tricks add: question variants, questions about invented subjects."""
    rows = []
    if recipe.question_variants:
        from .question_variants import variant_examples

        varied = variant_examples(calm.anchor.tokenizer, examples, recipe.question_variants, seed)
        rows += varied
        notes.append(f"question variants: {len(varied):,} rows, each question also asked {recipe.question_variants} "
                     "other ways" if varied else "question variants cannot apply: no row is a one-turn question")
    if recipe.unknown_subjects:
        from .unknown_subjects import unknown_subject_examples

        unknown, note = unknown_subject_examples(calm, examples, recipe.unknown_subjects, recipe.unknown_answer,
                                                 recipe.rehearsal_new_tokens, seed)
        rows += unknown
        notes.append(note)
    return rows


def new_words(example) -> str:
    """The completion's words that its prompt does not hold: the fact the augmenting model must supply ("Taifavand."
    in "Dathound Trufeigal was born in Taifavand." asked "Which town was Dathound Trufeigal born in?"). The value
    path's start is weighted to these tokens; weighted to whole answers, names copied from the prompt and the
    answer's own framing took most of the weight (the app's retrain of the real preset: 77-79% vs the demo's 91%)."""
    seen = set(re.findall(r"\w+", example.prompt.lower()))
    new = [w for w in example.completion.split() if not set(re.findall(r"\w+", w.lower())) <= seen]
    return " " + " ".join(new) if new else example.completion


@torch.no_grad()
def start_on_newest_token(calm, value: float) -> str:
    """Every block's recency bias (heads x ages) set to `value` at age 0: the newest augmenting token."""
    blocks = [b for bridge in calm.bridge.augments for b in bridge.blocks if getattr(b, "recency", None) is not None]
    if not blocks:
        return "recency start cannot apply: the bridge has no recency biases (recency 0); attention starts even"
    for block in blocks:
        block.recency[:, 0] = value
    return f"attention started on the augmenting model's newest token (recency bias {value:g} at age 0)"


def _vocabulary_start(calm, recipe: Recipe, examples: list, changes: dict) -> str:
    from .vocab_init import init_value_path, shared_tokens

    answers = [new_words(e) for e in examples if not e.keep_anchor and e.completion]
    reads_final = all(member.info.num_layers in bridge.augment_layers
                      for member, bridge in zip(calm.augments, calm.bridge.augments))
    shared = min(len(shared_tokens(calm.anchor.tokenizer, m.tokenizer)) for m in calm.augments)
    if not reads_final or shared < 2:
        changes["value_lr_scale"] = 1.0  # a random value path kept fixed would carry nothing
        why = ("no composition layer reads an augmenting model's final state (the map is between output "
               "vocabularies)" if not reads_final else "the two tokenizers share no tokens")
        return f"vocabulary start cannot apply: {why}; the value path starts at random and trains at the full rate"
    report = init_value_path(calm, answers=answers, answer_share=recipe.answer_share)["augments"]
    return ("value path started as the vocabulary map over " + ", ".join(f"{r['shared_tokens']:,} shared tokens "
            f"(residual {r['relative_residual']:.2f})" for r in report)
            + (", kept fixed" if recipe.value_lr_scale == 0 else ""))
