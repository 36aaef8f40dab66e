"""CALM Lab: compose two language models in the browser. The page is built in calm_app/ (layout,
handlers, views); every computation and figure lives in calm_core. `python app.py` serves it;
a Hugging Face Space runs this file too (app_file in README.md)."""
from __future__ import annotations

import os

import gradio as gr

from calm_app.layout import build_app
from calm_app.serving import quiet_queue

MAX_UPLOAD = "200mb"
demo = build_app()

if __name__ == "__main__":
    quiet_queue(demo.queue(default_concurrency_limit=4)).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), max_file_size=MAX_UPLOAD,
        theme=gr.themes.Soft(), show_error=True)
