"""Verification: acceptance under any rule (`verify`) and the sampling settings and draws it shares with
plain decoding (`sampling`)."""
