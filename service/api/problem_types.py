"""What each problem ``code`` means: the page a problem document's ``type`` names.

Every error answer is RFC 9457 problem+json whose ``type`` is ``/problems/<code>``, a
reference resolved against the API's own address (it used to name a domain nobody
serves). ``GET /problems/<code>`` answers this module's description of the code, and
``GET /problems`` all of them; a code not listed here still gets a page (the generic
one of its kind), so no ``type`` a client follows is a dead link. A refusal's ``detail``
says what happened this time and ``field`` which input; the page says what the code
means in general and what to do.
"""

from __future__ import annotations

#: the path every problem ``type`` starts with
PREFIX = "/problems/"

#: code -> what it means and what a caller does about it
PROBLEM_TYPES: dict[str, str] = {
    # input
    "bad_request": "The request is malformed (not JSON, a wrong content type of a part, a "
                   "header out of range). Fix the request; nothing was done.",
    "validation_error": "An input does not fit its schema or the dataset's public metadata: "
                        "`field` names it. Fix it and send again; nothing was spent.",
    "invalid_input": "A release's parameters did not fit what the mechanism can compute on "
                     "this data's public shape; it was refunded.",
    "incompatible_version": "A new version's metadata differs from the dataset's in a way "
                            "its releases depend on: `field` names it.",
    "method_not_allowed": "The path exists but not with this HTTP method.",
    "unsupported_media_type": "The body's Content-Type is not one this route reads "
                              "(JSON, or multipart for uploads).",
    "payload_too_large": "The body is larger than PRIVRELEASE_MAX_UPLOAD_BYTES (or a part "
                         "than its limit). Nothing was stored.",
    "csrf": "A console form came without its CSRF token (or with another's). Reload the "
            "page and submit again.",
    # who may do what
    "unauthorized": "No bearer token, or one that names no live key (unknown, revoked or "
                    "expired). Send `Authorization: Bearer <key>`.",
    "forbidden": "The key's role or grants do not allow this: the operator grants datasets "
                 "and roles.",
    "not_found": "No such object, or none this key may see (the two are not told apart).",
    # budgets and policy
    "budget_exhausted": "The release costs more than what remains of a cap or of the key's "
                        "allocation: `measure`, `requested`, `remaining` and `scope` say "
                        "which. Nothing was spent; ask for less or for a larger allocation.",
    "measure_not_admitted": "The dataset's operator did not enable the privacy measure this "
                            "release charges: no cap names it.",
    "notion_not_admitted": "The dataset's operator did not enable this privacy notion "
                           "(metadata `notions`).",
    "notion_locked": "The dataset has had releases of another notion; it admits one notion "
                     "at a time (noiseless and DP outputs together have no finite "
                     "guarantee).",
    "record_level_not_admitted": "Record-level releases (one output per record) are not "
                                 "enabled on this dataset (metadata `record_level`).",
    "policy_violation": "The request breaks a rule the operator set in the dataset's "
                        "metadata (e.g. a subset design whose public risk exceeds a "
                        "`subset_policy` threshold); the document names the values.",
    "target_unreachable": "No budget the dataset's cap allows gives a stated 95 % interval "
                          "within the target's half-width: `best_half_width` is what the "
                          "largest (`largest`) states. Ask for a wider interval, or for a "
                          "larger cap; nothing was spent.",
    "cap_below_spent": "A cap can not be set below what is already committed and reserved.",
    "allocation_above_cap": "An allocation can not exceed the dataset's cap of its measure.",
    "dataset_retired": "The dataset is retired: it takes no new releases or versions; its "
                       "releases stay readable.",
    "version_retired": "That version of the dataset is retired: it takes no new releases.",
    "version_conflict": "Another version of this dataset is being registered at the same "
                        "time; retry.",
    "version_current": "The current version can not be retired: make another one current "
                       "first.",
    "idempotency_mismatch": "This Idempotency-Key was used before with another request; "
                            "use a new key for a new request.",
    "replayed": "An identical earlier request was released before (`release_id`): a "
                "cold request priced by a worker ends refused with this, nothing spent; "
                "read that release instead.",
    # work and resources
    "work_limit": "The request would take more work than the server allows "
                  "(PRIVRELEASE_MAX_RELEASE_WORK): `field` names the parameter to reduce.",
    "memory_limit": "The release's memory bound, computed from public inputs, exceeds a "
                    "worker's (PRIVRELEASE_WORKER_MEMORY). Nothing was spent.",
    "time_limit": "The job ran past its time limit and was stopped.",
    "rate_limited": "Too many requests for this key or address; wait `Retry-After` seconds.",
    # sources (register by reference)
    "source_not_allowed": "The source is outside the roots the operator allows "
                          "(PRIVRELEASE_SOURCE_ROOTS).",
    "source_not_found": "No Parquet object or file is at that source.",
    "source_invalid": "The source is not Parquet this service can read, or does not match "
                      "the metadata.",
    "source_unreadable": "The source could not be read (permissions, storage errors).",
    "source_changed": "The source changed while it was read; nothing was registered. "
                      "Register it again once it is stable.",
    # jobs
    "release_not_ready": "The release has not succeeded (yet): it has no result to read.",
    "analysis_not_ready": "The analysis has not succeeded (yet): it has no result to read.",
    "analysis_ended": "The analysis has already ended: there is nothing to cancel.",
    "job_running": "The job is running: a running release can not be cancelled.",
    "job_finished": "The job has already ended.",
    "pricing_failed": "The worker that computes the release's cost failed; nothing was "
                      "spent. Try again.",
    "mechanism_failed": "The mechanism failed after it read the data: the release is "
                        "charged (why it failed may depend on the data).",
    "worker_lost": "The worker running the job was lost more times than the service "
                   "retries; refunded unless the data had been read.",
    "cancelled": "The job was cancelled.",
    "analysis_failed": "The analysis failed; analyses spend no budget.",
    # the service itself
    "conflict": "The request conflicts with the object's current state.",
    "unavailable": "A component the request needs (PostgreSQL, Valkey, workers) is not "
                   "reachable now; retry after `Retry-After` seconds. Nothing was spent.",
    "storage_unavailable": "The storage of datasets or results is not writable now; retry "
                           "later. Nothing was spent.",
    "insufficient_storage": "The storage is full; nothing was spent or stored.",
    "internal_error": "An error of the service itself; the log has it under the request "
                      "id. Nothing is spent by an error before a release reads its data.",
}

#: warnings a successful answer may carry (``warnings[].code``)
WARNING_TYPES: dict[str, str] = {
    "possible_reupload": "The upload has the shape of a dataset registered before: if it is "
                         "the same people, use a new version of that dataset instead (one "
                         "budget for the same people).",
    "skipped_objects": "Some objects under the source were skipped (hidden or marker files).",
}


def type_uri(code: str) -> str:
    """The ``type`` of a problem with ``code``."""
    return PREFIX + code


def describe(code: str) -> str:
    """What ``code`` means; a generic sentence for a code this module does not list."""
    return PROBLEM_TYPES.get(code) or WARNING_TYPES.get(code) or (
        "A refusal of this service: its `detail` says what happened and `field` which "
        "input.")
