"""Decoding: the loop over one prompt or many (`generate`), how each call drafts (`drafting`) and keeps
its batch's rows (`rows`), the adaptive tree (`adaptive`), what a call returns (`output`), how a run
decodes, resolved once (`settings`), and transformers' `model.generate`, the plain decoding speedups are
quoted against (`reference`)."""
