"""Policies: loading a policy by name or folder (`load`), the built-in tiny policies
(`tiny`), real models fetched from the package registry and converted once (`registry`),
the checks a policy folder must pass (`check`), and where `eval` and `diagnose` run one, in
what dtype (`device`)."""
