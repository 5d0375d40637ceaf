"""Everything that talks to MLflow: the store (``store``: where it is, checking and opening it
under its lock, the busy retry, provenance tags, and ``mlflow_client``, the one constructor of an
MLflow client), the trainer's metric logger (``logger``) and the UI and tracking server
(``ui``). See docs/training.md for what a user sees of them."""
