"""The CALM Lab Gradio app: layout.py builds the page, handlers.py answers its events, views.py
turns a session's state into what the widgets show. Every computation lives in calm_core."""
