"""A local Ray cluster for the sweep tests, held by this process: `python ray_head.py TEMP_DIR` starts it on
127.0.0.1 with two CPUs (`ray.init`, its files under TEMP_DIR), prints `ADDRESS host:port` once it is up, and stops
it when its standard input closes (the test's fixture closes it at the end of the session)."""

import sys

import ray

if __name__ == "__main__":
    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=sys.argv[1],
             configure_logging=False)
    print(f"ADDRESS {ray.get_runtime_context().gcs_address}", flush=True)
    sys.stdin.read()  # until the test closes it
    ray.shutdown()
