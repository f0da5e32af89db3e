"""The ground floor of the app layer: what every panel needs, importing no panel or view."""
