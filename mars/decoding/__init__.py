"""Decoding: the loop over one prompt or many (`generate`), how each call drafts (`drafting`) and keeps
its batch's rows (`rows`), the adaptive tree (`adaptive`), what a call returns (`output`), and how a run
decodes, resolved once (`settings`)."""
