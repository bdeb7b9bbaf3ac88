"""The schedule IR every formulation decodes into, its cost model, the replay check and schedule transforms."""
