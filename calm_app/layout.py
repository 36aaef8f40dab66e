"""The page: five tabs of widgets, then the events that connect them to handlers.py."""
from __future__ import annotations

import os
from types import SimpleNamespace

import gradio as gr

from calm_core.engine.config import GATE_TYPES, INSERT_POINTS
from calm_core.lab.comparison import FORGETTING
from calm_core.lab.figures import empty
from calm_core.lab.presets import list_presets
from calm_core.lab.resources import bf16_label
from calm_core.training.evaluation import METRICS

from . import handlers as h
from . import run_handlers as rh
from . import views

DEFAULT_PRESET = os.environ.get("CALM_DEFAULT_PRESET", "kv_arithmetic")
MODEL_HEADERS = ["role", "name", "architecture", "layers", "width", "heads", "parameters"]
DATA_TYPES = [".csv", ".jsonl", ".json", ".parquet", ".txt"]

INTRO = """# CALM Lab
Two frozen language models — an **anchor** and an **augmenting** model — joined by a small trained
**bridge**: at a few layers the anchor cross-attends to the augmenting model's hidden states and adds
the result through a **gate** that starts closed, so the composition starts out exactly as the anchor
(*LLM Augmented LLMs*, ICLR 2024). Work through the tabs from left to right."""


# Numbers carry no minimum / maximum of their own: the handlers check each against a range that follows
# from the models (calm_core.lab.bounds) and say what it is, without a traceback in the server log.


def models_tab(w: SimpleNamespace, presets: list[str], default: str | None) -> None:
    gr.Markdown("Pick a **preset** (a trained pair with its bridge), or any two causal language models by local "
                "folder or Hugging Face id. The bridge connects every *k*-th augmenting layer to an anchor layer.")
    with gr.Row():
        w.preset = gr.Dropdown(presets, value=default, label="Preset", scale=2)
        w.preset_btn = gr.Button("Load preset", variant="primary", scale=1)
        w.real_btn = gr.Button("Compose the real pair (Gemma 3 270M + SmolLM2-135M)", scale=1)
        w.reset_btn = gr.Button("Start over with a closed bridge", scale=1)
    w.models_note = gr.Markdown(views.real_pair_note())
    with gr.Accordion("…or choose your own models", open=False):
        with gr.Row():
            w.anchor = gr.Textbox(label="Anchor model (folder or hub id)")
            w.augments = gr.Textbox(label="Augmenting model(s), one per line")
        with gr.Row():
            w.every = gr.Number(4, label="every k-th augmenting layer", precision=0)
            w.anchor_layers = gr.Textbox(label="explicit anchor layers (e.g. 1,3)")
            w.augment_layers = gr.Textbox(label="explicit augmenting layers")
            w.heads = gr.Number(0, label="heads (0 = anchor's)", precision=0)
        with gr.Row():
            w.gate = gr.Radio(list(GATE_TYPES), value="channel", label="gate")
            w.insert = gr.Radio(list(INSERT_POINTS), value="after",
                                label="bridge at each anchor layer's output (after) or input (before)")
            w.recency = gr.Number(0, label="recency biases (0 = none)", precision=0)
            w.null_slot = gr.Checkbox(False, label="null slot (attention may write nothing)")
            w.window = gr.Number(0, label="window: newest augmenting states each token sees (0 = all)",
                                 precision=0)
        w.build_btn = gr.Button("Compose")
    w.models = gr.Dataframe(headers=MODEL_HEADERS, label="Models", interactive=False)
    w.bridge_md = gr.Markdown()
    w.diagram = gr.Plot(label="Composition layers")
    w.story = gr.Markdown()


def data_tab(w: SimpleNamespace) -> None:
    gr.Markdown("The bridge learns from a few examples of the **combined skill** (the paper uses 5–20% of the domain "
                "data). Upload CSV, JSON Lines, JSON, Parquet or text (up to 200 MB; large files: CSV or Parquet); "
                "map its columns; train. An optional **keep_anchor** column (true/false) marks rehearsal rows, "
                "trained toward what the anchor alone would say rather than toward their text.")
    with gr.Row():
        w.upload = gr.File(label="Upload data", file_types=DATA_TYPES, height=140)
        w.preset_data = gr.Dropdown([], label="…or a preset data set")
    w.preview = gr.Dataframe(label="Preview", interactive=False)
    w.data_note = gr.Markdown()
    with gr.Row():
        w.prompt_col = gr.Dropdown(["(none)"], value="(none)", label="prompt column")
        w.completion_col = gr.Dropdown(["(none)"], value="(none)", label="completion column")
        w.text_col = gr.Dropdown(["(none)"], value="(none)", label="text column")
        w.val_fraction = gr.Slider(0.0, 0.5, 0.1, step=0.05, label="validation share")
    w.use_data_btn = gr.Button("Use this data")
    with gr.Row():
        start = views.TRAIN_FIELDS  # a preset's own settings replace these when it loads (views.train_settings)
        w.steps = gr.Number(start["steps"], label="steps", precision=0)
        w.lr = gr.Number(start["lr"], label="learning rate")
        w.batch = gr.Number(start["batch_size"], label="batch size", precision=0)
        w.gate_lr = gr.Number(start["gate_lr_scale"], label="gate learning rate × (closed tanh gates open slowly; try 10-50)")
        w.augment_noise = gr.Number(start["augment_noise"],
                                    label="noise on augmenting states (few distinct augmenting inputs: try 0.5-1)")
    with gr.Accordion("All settings: recipe, learning-rate scales of the bridge's parts, precision", open=False):
        with gr.Row():
            w.recipe = gr.Dropdown(views.RECIPE_CHOICES, value="plain", label="recipe",
                                   info="How a new bridge starts and trains; choosing one fills the scales")
            w.position_lr = gr.Number(1.0, label="recency biases and null keys: learning rate ×")
            w.value_lr = gr.Number(1.0, label="value path: learning rate × (0 keeps it as it started)")
            w.bf16 = gr.Checkbox(False, label=bf16_label())
    w.method = gr.Radio(views.TRAIN_METHODS, value="calm", label="what to train",
                        info="A baseline trains the anchor itself on the same data, with as many trainable parameters "
                             "as the bridge (a copy: the anchor in Chat stays as it was); Evaluate then shows it beside "
                             "the composition, as the paper's comparison with LoRA does.")
    w.train_note = gr.Markdown()
    with gr.Row():
        w.run_name = gr.Textbox("", label="run name (the Runs tab keeps every run)", placeholder="e.g. lr 2e-3, knowledge",
                                max_length=80, scale=2)
        w.settings_upload = gr.File(label="Load settings (.yaml / .json from Runs)",
                                    file_types=[".yaml", ".yml", ".json"], height=180, scale=2)  # icon clear of the label
        w.train_btn = gr.Button("Train", variant="primary")
        w.stop_btn = gr.Button("Stop", variant="stop")
    w.train_status = gr.Markdown()
    with gr.Row():
        w.loss_plot = gr.Plot(label="Loss")
        w.acc_plot = gr.Plot(label="Held-out exact match")  # the figure's title says of what, and when
        w.gate_plot = gr.Plot(label="Gates")
    with gr.Row():
        w.download_btn = gr.Button("Prepare bridge download")
        w.bridge_file = gr.File(label="Bridge (config + safetensors)", interactive=False)
        w.bridge_upload = gr.File(label="Load a bridge", file_count="multiple",  # a short label: clear of the icon
                                  file_types=[".zip", ".json", ".safetensors"], height=200)
    w.bridge_status = gr.Markdown()
    gr.Markdown("*A bridge is a .zip from “Prepare bridge download”, or its bridge_config.json with bridge.safetensors.*")


def runs_tab(w: SimpleNamespace) -> None:
    gr.Markdown("Every training run of this session is kept: its settings, curves, scores and bridge. Tick two or more "
                "to **overlay their loss, held-out exact match and gate curves** and list the settings in which they "
                "differ. The first ticked run can be exported as a settings file and the equivalent command "
                "(`python -m calm_core train --config FILE` trains it again), downloaded as one .zip (bridge, optimizer "
                "state, settings, history), or resumed from its last checkpoint when it was stopped.")
    with gr.Row():
        w.runs_pick = gr.CheckboxGroup([], label="runs of this session", scale=4)
        w.runs_refresh = gr.Button("Refresh", scale=1)
    w.runs_note = gr.Markdown()
    w.runs_table = gr.Dataframe(headers=rh.RUN_HEADERS, label="Runs (final values)", interactive=False)
    w.runs_plot = gr.Plot(label="The ticked runs compared")
    w.runs_diff = gr.Dataframe(headers=["setting", "value"], label="Settings that differ between the ticked runs",
                               interactive=False)
    with gr.Row():
        w.runs_export_btn = gr.Button("Export settings")
        w.runs_zip_btn = gr.Button("Download run")
        w.runs_resume_btn = gr.Button("Resume training", variant="primary")
    with gr.Row():
        w.runs_yaml = gr.File(label="Settings file", interactive=False)
        w.runs_zip = gr.File(label="Run folder (.zip)", interactive=False)
        w.runs_upload = gr.File(label="Load a run (.zip from Download run): compare or resume it here",
                                file_types=[".zip"], height=140)
    w.runs_command = gr.Textbox(label="The same run from the command line", lines=3, buttons=["copy"])
    w.runs_status = gr.Markdown()
    with gr.Row():
        w.runs_loss = gr.Plot(label="Loss of the resumed run")
        w.runs_acc = gr.Plot(label="Held-out exact match of the resumed run")
        w.runs_gates = gr.Plot(label="Gates of the resumed run")


def chat_tab(w: SimpleNamespace) -> None:
    gr.Markdown("The same prompt goes to the **composition**, the **anchor alone** and the **augmenting model alone**. "
                "Slide the gate scale: 0 is the anchor exactly, 1 the trained bridge, above 1 exaggerates (a bridge "
                "without a gate is scaled the same way). A baseline trained in the Train tab can answer in a fourth "
                "column.")
    with gr.Row():
        w.bot_calm = gr.Chatbot(label="CALM (composed)", height=300)
        w.bot_anchor = gr.Chatbot(label="anchor alone", height=300)
        w.bot_augment = gr.Chatbot(label="augmenting model alone", height=300)
        w.bot_baseline = gr.Chatbot(label="baseline", height=300, visible=False)
    w.chat_baseline = gr.Dropdown([("none: train a baseline in the Train tab", views.NO_BASELINE)],
                                  value=views.NO_BASELINE, label="fourth column: a baseline",
                                  info="The anchor itself trained on the same data in the Train tab (LoRA, or its top "
                                       "layers), answering beside the composition; gate scale and layer switches are "
                                       "the bridge's and do not touch it.")
    w.message = gr.Textbox(label="Prompt", placeholder="Type a prompt, or pick one of the example prompts below")
    w.examples = gr.Dataset(components=[w.message], samples=[["Hello"]], label="Example prompts")
    with gr.Row():
        w.send = gr.Button("Send", variant="primary")
        w.clear = gr.Button("Clear")
    w.chat_note = gr.Markdown()
    with gr.Row():
        w.gate_scale = gr.Slider(0, 3, 1, step=0.05, label="gate scale")
        w.layers_off = gr.CheckboxGroup([], label="switch composition layers off")
    with gr.Accordion("Sampling", open=False):
        with gr.Row():
            w.mode = gr.Radio(["completion", "chat"], value="completion", label="prompt as")
            w.max_new = gr.Slider(1, 256, 16, step=1, label="max new tokens")
            w.do_sample = gr.Checkbox(False, label="sample")
            w.temperature = gr.Slider(0.05, 2, 1, label="temperature")
            w.top_k = gr.Number(0, label="top-k (0 = off)", precision=0)
            w.top_p = gr.Slider(0.05, 1, 1, label="top-p")
            w.seed = gr.Number(0, label="seed", precision=0)


def bridge_tab(w: SimpleNamespace) -> None:
    gr.Markdown("How far each gate has opened, channel by channel and over training; and where each anchor token looks "
                "in the augmenting model's tokens. Use the camera icon on a figure to export it.")
    w.gates_btn = gr.Button("Show gates")
    with gr.Row():
        w.gate_bars = gr.Plot(empty("Press “Show gates”"), label="Gate opening")
        w.gate_hist = gr.Plot(empty("Train the bridge to see its gates move"), label="Over training")
    w.gate_heat = gr.Plot(empty("Press “Show gates”"), label="Layer × channel")
    with gr.Row():
        w.attn_text = gr.Textbox(label="Text to look at (both models read it)", scale=3)
        w.attn_mode = gr.Radio(list(views.ATTENTION_READINGS), value=views.ATTENTION_READINGS[0], label="read it as",
                               info="chat question: wrapped in the anchor's chat template, as the Chat tab's "
                                    "chat mode sends it (a chat preset's bridge was trained on such prompts)")
        w.attn_layer = gr.Dropdown([0], value=0, label="composition layer")
        w.attn_head = gr.Dropdown(["mean"], value="mean", label="head")
    w.attn_btn = gr.Button("Show cross-attention")
    w.attn_plot = gr.Plot(empty("Type a text and press “Show cross-attention”"), label="Cross-attention")


def evaluate_tab(w: SimpleNamespace) -> None:
    gr.Markdown("The anchor alone, the augmenting model alone and the composition on the same examples, as the paper's "
                "tables compare them, and each baseline trained in the Train tab (the anchor itself trained on the same "
                "data with as many parameters as the bridge). A preset's sets are scored, and given as many new tokens, "
                "as its table was.")
    with gr.Row():
        w.eval_choice = gr.Dropdown([], label="Evaluation set")
        w.eval_upload = gr.File(label="…or upload one", file_types=DATA_TYPES, height=140)
    with gr.Row():
        w.metrics = gr.CheckboxGroup(list(METRICS) + [FORGETTING], value=["exact_match", "loss"], label="metrics",
                                     info="forgetting: 16 general questions the anchor answered before; perplexity of "
                                          "their answers against the anchor alone's (1 = unchanged), answers holding the "
                                          "expected word")
        w.eval_max_new = gr.Number(16, label="max new tokens", precision=0)
        w.eval_limit = gr.Number(100, label="examples (0 = all)", precision=0)
    w.eval_btn = gr.Button("Evaluate", variant="primary")
    w.eval_table = gr.Dataframe(label="Results", interactive=False)
    w.eval_plot = gr.Plot(label="The table as bars: one panel per metric, one bar per model")
    w.eval_sigs = gr.Markdown()
    w.paper_md = gr.Markdown()


def wire(demo: gr.Blocks, w: SimpleNamespace) -> None:
    """Every event: which handler, from which widgets, to which."""
    model = [w.session, w.models, w.bridge_md, w.diagram, w.layers_off, w.attn_layer, w.examples, w.attn_head, w.story]
    data = [w.preview, w.data_note, w.prompt_col, w.completion_col, w.text_col]
    fresh = [w.max_new, w.mode, w.bot_calm, w.bot_anchor, w.bot_augment, w.message,
             w.steps, w.lr, w.batch, w.gate_lr, w.augment_noise, w.train_note, w.bridge_file, w.train_status,
             w.bridge_status, w.attn_mode, w.chat_baseline, w.bot_baseline, w.recipe, w.position_lr, w.value_lr, w.bf16]
    everything = model[:7] + data + [w.eval_choice, w.paper_md, w.preset_data, w.metrics] + model[7:] + [w.eval_max_new] + fresh
    demo.load(h.start, [w.preset], everything, api_name="start")
    w.preset_btn.click(h.use_preset, [w.session, w.preset], everything, api_name="use_preset")
    w.build_btn.click(h.build, [w.session, w.anchor, w.augments, w.every, w.anchor_layers, w.augment_layers, w.heads,
                                w.gate, w.insert, w.recency, w.null_slot, w.window], model + fresh, api_name="build")
    w.reset_btn.click(h.reset_bridge, w.session, [w.models_note] + model + fresh, api_name="reset_bridge")
    w.real_btn.click(h.load_real_pair, w.session, [w.models_note] + model + fresh, api_name="real_pair")

    w.upload.change(h.inspect_upload, [w.session, w.upload], data, api_name="inspect_upload")
    w.use_data_btn.click(h.use_data, [w.session, w.upload, w.preset_data, w.prompt_col, w.completion_col, w.text_col,
                                      w.val_fraction], w.data_note, api_name="use_data")
    w.recipe.input(h.choose_recipe, [w.session, w.recipe], [w.steps, w.lr, w.batch, w.gate_lr, w.augment_noise,
                                                          w.train_note, w.recipe, w.position_lr, w.value_lr, w.bf16],
                   api_name="choose_recipe")
    w.train_btn.click(h.train, [w.session, w.steps, w.lr, w.batch, w.gate_lr, w.augment_noise, w.method, w.recipe,
                                w.position_lr, w.value_lr, w.bf16, w.run_name],
                      [w.train_status, w.loss_plot, w.gate_plot, w.bridge_file, w.acc_plot], api_name="train",
                      concurrency_limit=None, show_progress="minimal", show_progress_on=[w.train_status])
    w.stop_btn.click(h.stop, w.session, w.train_status, api_name="stop", queue=False,  # not behind queued events
                     show_progress="hidden")
    w.download_btn.click(h.download_bridge, w.session, w.bridge_file, api_name="download_bridge")
    w.settings_upload.upload(rh.load_settings, [w.session, w.settings_upload],
                             [w.steps, w.lr, w.batch, w.gate_lr, w.augment_noise, w.train_note, w.recipe, w.position_lr,
                              w.value_lr, w.bf16], api_name="load_settings")
    runs = [w.runs_pick, w.runs_table, w.runs_plot, w.runs_diff, w.runs_note]
    w.runs_refresh.click(rh.show_runs, [w.session, w.runs_pick], runs, api_name="runs")
    w.runs_pick.input(rh.show_runs, [w.session, w.runs_pick], runs)
    w.runs_export_btn.click(rh.export_run, [w.session, w.runs_pick], [w.runs_yaml, w.runs_command], api_name="export_run")
    w.runs_zip_btn.click(rh.download_run, [w.session, w.runs_pick], w.runs_zip, api_name="download_run")
    w.runs_upload.upload(rh.import_run, [w.session, w.runs_upload, w.runs_pick], runs, api_name="import_run")
    w.runs_resume_btn.click(rh.resume_run, [w.session, w.runs_pick], [w.runs_status, w.runs_loss, w.runs_gates, w.runs_acc],
                            api_name="resume_run", concurrency_limit=None, show_progress="minimal").then(
        rh.show_runs, [w.session, w.runs_pick], runs)
    w.bridge_upload.upload(lambda: "", None, w.bridge_status).then(  # no stale message under a later error
        h.upload_bridge, [w.session, w.bridge_upload], model + fresh, api_name="upload_bridge")

    chat_inputs = [w.session, w.message, w.bot_calm, w.bot_anchor, w.bot_augment, w.max_new, w.do_sample,
                   w.temperature, w.top_k, w.top_p, w.seed, w.gate_scale, w.layers_off, w.mode, w.chat_baseline,
                   w.bot_baseline]
    chat_outputs = [w.bot_calm, w.bot_anchor, w.bot_augment, w.chat_note, w.bot_baseline]
    # one event for Send and Enter: a prompt sent while a reply streams runs once that reply has ended
    # ("always_last"), on the histories as they are then, instead of being dropped or racing it
    gr.on([w.send.click, w.message.submit], h.chat, chat_inputs, chat_outputs, api_name="chat",
          concurrency_limit=None, trigger_mode="always_last")
    w.examples.click(lambda row: row[0], w.examples, w.message)
    w.clear.click(lambda: ([], [], [], "", []), None, chat_outputs)
    w.chat_baseline.change(views.baseline_column, [w.session, w.chat_baseline], w.bot_baseline)

    w.gates_btn.click(h.show_gates, w.session, [w.gate_bars, w.gate_heat, w.gate_hist], api_name="gates")
    w.attn_btn.click(h.show_attention, [w.session, w.attn_text, w.attn_layer, w.attn_head, w.attn_mode], w.attn_plot,
                     api_name="attention")
    w.eval_btn.click(lambda: (None, None, ""), None, [w.eval_table, w.eval_plot, w.eval_sigs]).then(h.run_eval, [w.session, w.eval_choice, w.eval_upload, w.metrics, w.eval_max_new, w.eval_limit],
                     [w.eval_table, w.eval_plot, w.eval_sigs], api_name="evaluate", concurrency_limit=None)


def build_app() -> gr.Blocks:
    presets = list_presets()
    default = DEFAULT_PRESET if DEFAULT_PRESET in presets else (presets[0] if presets else None)
    w = SimpleNamespace(tabs={})
    with gr.Blocks(title="CALM Lab") as demo:
        w.session = gr.State(delete_callback=lambda s: s and s.close())
        gr.Markdown(INTRO)
        with gr.Tabs():
            for title, tab in (("1 · Models", lambda: models_tab(w, presets, default)), ("2 · Data & train", lambda: data_tab(w)),
                               ("3 · Chat", lambda: chat_tab(w)), ("4 · Inside the bridge", lambda: bridge_tab(w)),
                               ("5 · Evaluate", lambda: evaluate_tab(w)), ("6 · Runs", lambda: runs_tab(w))):
                with gr.Tab(title) as w.tabs[title]:
                    tab()
        wire(demo, w)
        # baselines trained since the Chat tab was last open join its fourth-column menu
        w.tabs["3 · Chat"].select(views.baseline_menu, [w.session, w.chat_baseline], w.chat_baseline)
        w.tabs["6 · Runs"].select(rh.show_runs, [w.session, w.runs_pick],
                                  [w.runs_pick, w.runs_table, w.runs_plot, w.runs_diff, w.runs_note])
    return demo
