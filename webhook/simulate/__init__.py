"""`slurmedic simulate`: a discrete-event simulation of a GPU cluster failing, answered by
no automation, a naive responder, slurmedic's real core, and an oracle."""
