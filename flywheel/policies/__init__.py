"""Policies: loading a policy by name or folder (`load`), the built-in tiny policies
(`tiny`), real models fetched from the package registry and converted once (`registry`),
and the checks a policy folder must pass (`check`)."""
