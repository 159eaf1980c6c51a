"""The bottom layer: the leaves every side of the project shares. Nothing here imports the rest of it.

  types        the dataclasses passed between modules (users import them as `rl_factory.types`)
  registry     the registry behind every pluggable name
  errors       `UserError` and kin: the errors that mean "what you gave is wrong"
  imports      importing user code given as a file path
  usercode     user code must not take the run down (its `SystemExit` is an error)
  http         one HTTP request with an overall deadline and a byte cap
  loop_local   a value per running event loop
  secrets      which strings are secret, and scrubbing them from everything we print
  judging      `JudgeError` and the pairwise judge protocol
  files        writing a file whole or not at all (`write_atomic`)

`envs`, `rewards` and `rl_factory.algorithms` import only this layer of the project (tests/test_layers.py).
"""
