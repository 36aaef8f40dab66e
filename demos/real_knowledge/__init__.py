"""Knowledge that only the augmenting model has, used by a frozen real chat model through the bridge."""
