"""Settings shared by every test tier."""

from hypothesis import settings

# Property tests check behaviour, not speed: on two shared cores an example can take more
# than Hypothesis's default 200 ms deadline while another process runs, which only flakes.
settings.register_profile("pdserve", deadline=None)
settings.load_profile("pdserve")
