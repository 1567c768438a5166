"""The published NAS-FCOS models in fcos-d2's model zoo: ``fcos-d2://NAS-FCOS/<name>``.

The links are the authors' (their README's MEGA mirror). MEGA serves files through its web
client only, so ``model_zoo.get(..., trained=True)`` cannot fetch them: download the file
by hand and set ``MODEL.WEIGHTS`` to it (the NAS-FCOS layout converts on load).
"""
from ...checkpoint.published import ModelZooEntry, register_model_zoo_entry

_MEGA = "https://mega.nz/#!{}"
PUBLISHED = {  # name (= config file) -> MEGA file id and key
    "Mobile_NAS": "Gu4DAS7K!Cp46jUVhOIvVhPUOtukrHKJfao_Pk5vAwaU_xz8haR0",
    "Mobile_NAS_head": "ruIzSSxR!NIQEk-PG-aPYdSryRpSscE3pD81YJysVs6z1-o48-V0",
    "R_50_NAS": "y34TGYbJ!Vv_k-GcGTW7A_F_Ov5f44PfzCfpK6oYrtS1ZIC9gFK8",
    "R_50_NAS_head": "H7g0TQ6R!VL9jEjviVMSuPoOYeZceS8usnoy3bulZDrHc0QDIO6A",
    "R_101_NAS": "Xqx1TS7S!MPiiasknw6M2aJjdR6SkevFFadgmJW8_TOJig_naXnE",
    "R_101_NAS_head": "uiJj3ICR!NdU3VaBtsdySFS0QezVpiV8Yz4h4CaqG63ST357860E",
    "R_101_X_32x8d_NAS": "qqpRUCaI!tj24t4tLWF_Qn56ZvdTkdxWzoXcP1gFEwgk4OK__Shw",
}

for _name, _share in PUBLISHED.items():
    register_model_zoo_entry(f"NAS-FCOS/{_name}", ModelZooEntry(
        f"NAS-FCOS/{_name}.yaml", _name, "NAS-FCOS", _MEGA.format(_share)))
