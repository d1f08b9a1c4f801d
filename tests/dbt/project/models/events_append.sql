{{ config(materialized='incremental', incremental_strategy='append') }}
select id, {{ var('load') }} as load from {{ ref('people') }}
