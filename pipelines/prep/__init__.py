"""Data prep: raw logs -> quarantine | clean turns -> SFT examples with splits and a manifest."""
