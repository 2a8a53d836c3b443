"""The books of verification: what a relaxation costs (`cost`), that cost settled after the loop
(`deferred`), the statistics of what was accepted (`stats`), and how a call's phases are timed (`timing`)."""
