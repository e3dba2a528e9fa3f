"""A notebook session with privrelease-client, cell by cell (run it as a script too).

Needs a running service (``privrelease standalone``) and an operator key:

    export PRIVRELEASE_URL=http://127.0.0.1:8000
    export PRIVRELEASE_KEY=$(cat var/bootstrap-key)
    python examples/notebook_client.py

It uploads a small synthetic dataset, estimates a release before spending, releases a
mean and a histogram, reads them as pandas DataFrames, releases interval-privatized
records and fits their distribution (an NPMLE analysis, free of budget).
"""

from __future__ import annotations

import random

from privrelease_client import BudgetExhausted, Client

# %% connect: PRIVRELEASE_URL and PRIVRELEASE_KEY
client = Client()

# %% upload a dataset with its public metadata (bounds and budgets are public)
rng = random.Random(7)
rows = [(round(rng.betavariate(2, 5), 4), rng.choice("abc")) for _ in range(400)]
csv = "income,group\n" + "".join(f"{x},{g}\n" for x, g in rows)
dataset = client.upload_dataset(csv.encode(), {
    "name": "notebook-example",
    "columns": {"income": {"type": "continuous", "bounds": [0, 1]},
                "group": {"type": "categorical", "categories": ["a", "b", "c"]}},
    "budgets": {"epsilon": 2, "interval_leakage": 0.9},
    # interval releases give one output per record: the operator opts in explicitly
    # (the notions, dp and interval, follow from the budgets)
    "record_level": True,
})
ds = dataset["id"]
print("dataset", ds, dataset["n_rows"], "rows")

# %% estimate first: cost, expected accuracy and what would remain; spends nothing
mean_params = {"statistic": "mean", "column": "income"}
estimate = client.estimate(ds, "laplace", mean_params, {"epsilon": 0.5})
print("estimate", estimate["cost"], estimate["remaining"])

# %% release, wait (a status line on a terminal or in a notebook), read the result
mean = client.submit(ds, "laplace", mean_params, {"epsilon": 0.5}).wait(timeout=60)
print(mean.status, mean.result, mean.guarantee)
print(mean.to_pandas())

# %% a histogram comes back as one row per category
hist = client.submit(ds, "laplace", {"statistic": "histogram", "column": "group"},
                     {"epsilon": 0.5}).wait(timeout=60)
frame = hist.to_pandas()
print(frame)

# %% asking for more than remains raises BudgetExhausted with the amounts
try:
    client.submit(ds, "laplace", mean_params, {"epsilon": 5})
except BudgetExhausted as refused:
    print("refused:", refused.measure, "requested", refused.requested,
          "remaining", refused.remaining)

# %% interval privacy: each record becomes an interval; /data is a DataFrame
records = client.submit(ds, "interval.case1", {"column": "income", "calibrate": True},
                        {"interval_leakage": 0.5}).wait(timeout=120)
data = records.data().to_pandas()
print(data.head())

# %% analyses are free post-processing: fit the distribution (NPMLE), read it as a table
npmle = records.analyze("npmle").wait(timeout=120)
print(npmle.name, npmle.status)
print(npmle.to_pandas().head())
print("analyses of", records.id, [a.name for a in records.analyses()])

# %% every release of the dataset, all pages
print([r["mechanism"] for r in client.iter_releases(dataset_id=ds)])
