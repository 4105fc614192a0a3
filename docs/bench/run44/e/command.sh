#!/usr/bin/env bash
# run 44e: run 44d's profile again on 44d's machine, still warm, with the interpreter's GIL
# switch interval at 0.1 ms instead of the engine loop's 0.5 ms (SWITCH_INTERVAL_S patched
# before the script reads it), 1 and 8 prompts, 20 admissions a case.
source scripts/gpu_env.sh > /dev/null 2>&1; timeout 150 python -c "import triton_qwen3_tts.engines.native.engine as e; e.SWITCH_INTERVAL_S=1e-4; import runpy,sys; sys.argv=['x','--checkpoint','/tmp/ckpt-1.7b-customvoice','--prompts','1','8','--repeat','20','--json','$OUT/admission_si100us.json']; runpy.run_path('scripts/admission_profile.py', run_name='__main__')" 2>&1 | tee $OUT/admission_si100us.txt
