"""Env services: envs that live in other processes or machines, served over ZeroMQ.

protocol      the wire format (a JSON header and raw array frames, never pickles)
env_server    serves C instances of a registered env on one port
remote_env    the client side: one instance behind a server, as a gymnasium.Env; ServerChannel for `steps`
batch_step    several slots stepped at once: one `steps` message per server, replies awaited together
skip          skip mode (--env_service=skip:ENV): a socketless server in the caller's own process
env_pool      a rollout worker's or evaluator's slots: health checks, failover, re-admission, slots added
              and drained; slot: one slot and its states; slot_checker: the pool's background thread
pooled_env    a gymnasium.Env on whichever slot of a pool it holds
slot_choice   which idle slot a pool hands out: least-loaded (the fewest steps in flight on its server)
service_set   a composed env's slots, one of each named pool, held and let go of together
concurrent_calls  a composed env's calls to several services at once (`ctx.services.step({...})`)
endpoints     --env_service: parsing, probing, and dividing slots among workers
capacity      the slot arithmetic: each worker's contiguous share, the smallest pool
fleet_file, launcher   a fleet file, and starting and stopping its local servers (python -m sf_core.fleet)
elastic, fleet_control  slots added and drained while runs go on: the changes file every pool follows,
              and `fleet add|drain` (FleetControl)
training      what training asks of the services (the engine's one way in): the served spaces, a rollout
              worker's pool of slots, the slots shared among a cluster's samplers

The evaluator that runs tasks on these slots is in sf_core/evaluation/.
"""
