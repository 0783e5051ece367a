"""The trials of the hostile campaign (scripts/hostile_campaign.py), one module per kind."""
